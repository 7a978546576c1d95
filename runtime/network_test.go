package runtime_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
)

// isolatedRuntime is a runtime whose containers get their own network, on
// a bridge of a name no other test process uses.
func isolatedRuntime(t *testing.T, blocked [2]int) *runtime.Containerd {
	t.Helper()
	return runtimetest.New(t, runtime.ContainerdOptions{Network: runtime.NetworkOptions{
		Mode: runtime.NetworkIsolated, Name: fmt.Sprintf("isolation-rt-%d", os.Getpid()),
		StateDir: t.TempDir(), BlockedPorts: blocked,
	}})
}

// serve starts a container whose httpd answers on port, published.
func serve(t *testing.T, rt runtime.Runtime, id string, port int) runtime.Info {
	t.Helper()
	ctx := context.Background()
	err := rt.Start(ctx, runtime.Spec{ID: id, Image: runtimetest.ImageRef,
		Args:    []string{"sh", "-c", fmt.Sprintf("echo %s > /tmp/index.html && exec httpd -f -p %d -h /tmp", id, port)},
		Publish: []runtime.Published{{Port: port}}})
	if err != nil {
		t.Fatal(err)
	}
	in, err := rt.Status(ctx, id)
	if err != nil || in.IP == "" {
		t.Fatalf("Status(%s) = %+v, %v; want an address", id, in, err)
	}
	return in
}

// get fetches url from the host until it answers (20s at most).
func get(t *testing.T, url string) string {
	t.Helper()
	c := http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := c.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return strings.TrimSpace(string(b))
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %v", url, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// hostAddr is an address of this machine other than loopback.
func hostAddr(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !strings.HasPrefix(n.IP.String(), "10.1") {
			return n.IP.String()
		}
	}
	t.Skip("no non-loopback IPv4 address on this machine")
	return ""
}

func TestIsolatedNetworkPublishesOnlyWhatIsAsked(t *testing.T) {
	pa, pb := freePort(t), freePort(t)
	rt := isolatedRuntime(t, [2]int{min(pa, pb), max(pa, pb)})
	a := serve(t, rt, "net-a", pa)
	b := serve(t, rt, "net-b", pb)
	if a.IP == b.IP {
		t.Fatalf("two containers share address %s", a.IP)
	}
	// Published: reachable on the host's loopback and its own address.
	if got := get(t, fmt.Sprintf("http://127.0.0.1:%d/", pa)); got != "net-a" {
		t.Fatalf("published port of net-a answers %q", got)
	}
	node := hostAddr(t)
	if got := get(t, fmt.Sprintf("http://%s:%d/", node, pb)); got != "net-b" {
		t.Fatalf("published port of net-b on %s answers %q", node, got)
	}

	// A host listener on every address, as etcd or the agent would be.
	l, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprint(c, "HTTP/1.0 200 OK\r\n\r\nhost-secret\n")
			c.Close()
		}
	}()
	hostPort := l.Addr().(*net.TCPAddr).Port
	gw := a.IP[:strings.LastIndexByte(a.IP, '.')] + ".1"

	// From inside net-b: nothing but the outside world.
	script := ""
	for _, target := range []string{
		fmt.Sprintf("%s:%d", a.IP, pa),       // another container, directly
		fmt.Sprintf("%s:%d", node, pa),       // another container's published port
		fmt.Sprintf("%s:%d", gw, hostPort),   // the host, through the gateway
		fmt.Sprintf("%s:%d", node, hostPort), // the host, at its own address
	} {
		script += fmt.Sprintf("if timeout 3 wget -q -O - http://%s/ >/dev/null 2>&1; then echo REACHED %s; else echo REFUSED %s; fi; ", target, target, target)
	}
	code, out := runBatch(t, rt, runtime.Spec{ID: "net-probe", Image: runtimetest.ImageRef, Args: []string{"sh", "-c", script},
		LogPath: filepath.Join(t.TempDir(), "probe.log")})
	if code != 0 {
		t.Fatalf("probe exited %d:\n%s", code, out)
	}
	if strings.Contains(out, "REACHED") || strings.Count(out, "REFUSED") != 4 {
		t.Fatalf("a container reached what it must not:\n%s", out)
	}
}
