package runtime

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"
)

// BusyboxApplets are the commands a busybox image links to /bin/busybox.
var BusyboxApplets = []string{
	"sh", "cat", "echo", "env", "id", "ls", "mkdir", "sleep", "httpd", "wget",
	"touch", "true", "false", "test", "printf", "head", "tail", "wc", "stat",
	"kill", "ps", "grep", "seq", "nc", "timeout", "base64", "sha256sum", "cut",
}

// jupyterStandIn is the busybox image's /bin/jupyter: not Jupyter, but a
// page served by busybox httpd on the --port it is given, so that a
// notebook session on this image reaches Running and its URL answers.
const jupyterStandIn = `#!/bin/sh
# Voyager's busybox image: a STAND-IN for Jupyter (busybox httpd), not Jupyter.
port=8888
for a in "$@"; do case "$a" in --port=*) port="${a#--port=}";; esac; done
mkdir -p /tmp/www/lab
page="<h1>Voyager session $VOYAGER_SESSION</h1><p>This image has no Jupyter: busybox httpd stands in for it.</p>"
echo "$page" > /tmp/www/index.html
echo "$page" > /tmp/www/lab/index.html
# As PID 1 httpd would ignore SIGTERM; the shell stops it on TERM.
httpd -f -p "$port" -h /tmp/www &
trap 'kill $!; exit 0' TERM INT
wait
`

// rayStandIn is the busybox image's /bin/ray: not Ray, but busybox httpd
// on the ports `ray start` is given (GCS, client server, node and object
// managers), a page on the dashboard's --dashboard-host and
// --dashboard-port as Ray's dashboard would be, and, for a worker
// (--address), a connection to its head, retried for a minute, so that
// gang tests can tell whether the parts of a session reach each other. With
// RAY_AUTH_MODE=token the head's page shows a fingerprint of its
// RAY_AUTH_TOKEN and a worker with another token exits 1, as Ray's token
// authentication refuses it.
const rayStandIn = `#!/bin/sh
# Voyager's busybox image: a STAND-IN for Ray (busybox httpd on Ray's ports), not Ray.
mode=worker; ports=""; addr=""; block=""; dhost=127.0.0.1; dport=""
for a in "$@"; do case "$a" in
--head) mode=head;;
--dashboard-host=*) dhost="${a#*=}";;
--dashboard-port=*) dport="${a#*=}";;
--port=*|--ray-client-server-port=*|--node-manager-port=*|--object-manager-port=*) ports="$ports ${a#*=}";;
--address=*) addr="${a#--address=}";;
--block) block=1;;
esac; done
# Ray's token authentication (RAY_AUTH_MODE=token): the head shows a
# fingerprint of its token and a worker joins only with the same one.
fp=""
if [ "$RAY_AUTH_MODE" = token ]; then fp=$(printf %s "$RAY_AUTH_TOKEN" | sha256sum | cut -c1-16); fi
mkdir -p /tmp/ray
echo "ray $mode of $VOYAGER_SESSION${fp:+ auth $fp}" > /tmp/ray/index.html
for p in $ports; do httpd -p "$p" -h /tmp/ray || exit 1; done
if [ -n "$dport" ]; then
mkdir -p /tmp/ray-dashboard/api
echo "ray dashboard stand-in of $VOYAGER_SESSION" > /tmp/ray-dashboard/index.html
echo '{"ray_version": "stand-in"}' > /tmp/ray-dashboard/api/version
httpd -p "$dhost:$dport" -h /tmp/ray-dashboard || exit 1
fi
if [ -n "$addr" ]; then
n=0
until timeout 3 wget -q -O /tmp/ray/head "http://$addr/" 2>/dev/null; do
n=$((n+1)); if [ $n -ge 30 ]; then echo "ray stand-in: head $addr unreachable" >&2; exit 1; fi; sleep 1
done
hp=$(cat /tmp/ray/head); want=""
case "$hp" in *" auth "*) want="${hp##* auth }";; esac
if [ "$want" != "$fp" ]; then echo "ray stand-in: head $addr refused this worker's authentication token" >&2; exit 1; fi
echo "ray stand-in: joined head $addr: $hp"
fi
if [ -n "$block" ]; then trap 'exit 0' TERM INT; sleep 2147483647 & wait; fi
exit 0
`

// ImageFile is a further file of a busybox image (WriteBusyboxImage): a
// test's stand-in program, say.
type ImageFile struct {
	// Path is the file's path in the image, without a leading slash,
	// e.g. "bin/rendezvous".
	Path string
	Mode int64
	Body []byte
}

// WriteBusyboxImage writes a one-layer docker-archive image named ref to w
// from a static busybox binary at busybox (Debian's busybox-static installs
// it at /bin/busybox): /bin with busybox and its applets, /etc/passwd with
// root and jovyan (1000:100), /tmp and /home, /bin/jupyter, a stand-in
// that serves a page with busybox httpd on its --port, and /bin/ray, a
// stand-in that listens on Ray's ports (rayStandIn). No registry is needed: import
// the archive with Containerd.Import. It is the image of tests and of
// `voyager dev` on a machine without one. extra are added as they are.
func WriteBusyboxImage(w io.Writer, busybox, ref string, extra ...ImageFile) error {
	bin, err := os.ReadFile(busybox)
	if err != nil {
		return fmt.Errorf("read busybox binary (apt-get install busybox-static): %w", err)
	}
	var layer bytes.Buffer
	lt := tar.NewWriter(&layer)
	mod := time.Unix(0, 0)
	entries := []struct {
		hdr  tar.Header
		body []byte
	}{
		{hdr: tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755}},
		{hdr: tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755}},
		{hdr: tar.Header{Name: "home/", Typeflag: tar.TypeDir, Mode: 0o755}},
		{hdr: tar.Header{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777}},
		{hdr: tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755}, body: bin},
		{hdr: tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644},
			body: []byte("root:x:0:0:root:/root:/bin/sh\njovyan:x:1000:100:jovyan:/home/jovyan:/bin/sh\n")},
		{hdr: tar.Header{Name: "etc/group", Typeflag: tar.TypeReg, Mode: 0o644},
			body: []byte("root:x:0:\nusers:x:100:\n")},
		{hdr: tar.Header{Name: "bin/jupyter", Typeflag: tar.TypeReg, Mode: 0o755}, body: []byte(jupyterStandIn)},
		{hdr: tar.Header{Name: "bin/ray", Typeflag: tar.TypeReg, Mode: 0o755}, body: []byte(rayStandIn)},
	}
	for _, a := range BusyboxApplets {
		entries = append(entries, struct {
			hdr  tar.Header
			body []byte
		}{hdr: tar.Header{Name: "bin/" + a, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}})
	}
	for _, f := range extra {
		entries = append(entries, struct {
			hdr  tar.Header
			body []byte
		}{hdr: tar.Header{Name: f.Path, Typeflag: tar.TypeReg, Mode: f.Mode}, body: f.Body})
	}
	for _, e := range entries {
		h := e.hdr
		h.Size, h.ModTime, h.Format = int64(len(e.body)), mod, tar.FormatPAX
		if err := lt.WriteHeader(&h); err != nil {
			return fmt.Errorf("write image layer: %w", err)
		}
		if _, err := lt.Write(e.body); err != nil {
			return fmt.Errorf("write image layer: %w", err)
		}
	}
	if err := lt.Close(); err != nil {
		return fmt.Errorf("write image layer: %w", err)
	}
	sum := sha256.Sum256(layer.Bytes())
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      mod.UTC().Format(time.RFC3339),
		"config": map[string]any{
			"Env":        []string{"PATH=/bin"},
			"Cmd":        []string{"/bin/sh"},
			"WorkingDir": "/",
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + hex.EncodeToString(sum[:])}},
	})
	if err != nil {
		return fmt.Errorf("write image config: %w", err)
	}
	manifest, err := json.Marshal([]map[string]any{{
		"Config":   "config.json",
		"RepoTags": []string{ref},
		"Layers":   []string{"layer.tar"},
	}})
	if err != nil {
		return fmt.Errorf("write image manifest: %w", err)
	}
	tw := tar.NewWriter(w)
	for _, f := range []struct {
		name string
		body []byte
	}{{"config.json", config}, {"layer.tar", layer.Bytes()}, {"manifest.json", manifest}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body)), ModTime: mod, Typeflag: tar.TypeReg}); err != nil {
			return fmt.Errorf("write image archive: %w", err)
		}
		if _, err := tw.Write(f.body); err != nil {
			return fmt.Errorf("write image archive: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	return nil
}
