package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCertsKeepsAndRenews: voyager certs writes the CA and one pair per
// identity; run again it keeps them and adds a new node's; --renew issues
// the leaves again from the same CA.
func TestCertsKeepsAndRenews(t *testing.T) {
	dir := t.TempDir()
	run := func(extra ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		root := newRootCmd(&out, &errb)
		root.SetArgs(append([]string{"certs", "--dir", dir, "--etcd", "etcd-1=10.0.0.1", "--node", "gpu-1=10.0.0.21"}, extra...))
		if err := root.ExecuteContext(context.Background()); err != nil {
			t.Fatalf("voyager certs %v: %v\n%s", extra, err, errb.String())
		}
		return out.String()
	}
	run()
	want := []string{"ca.pem", "ca-key.pem", "etcd/etcd-1.pem", "etcd/etcd-1-key.pem", "root.pem", "voyager-api.pem",
		"voyager-placer.pem", "voyager-operator.pem", "voyager-agent-gpu-1.pem", "voyager-agent-gpu-1-key.pem"}
	for _, f := range want {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatalf("no %s: %v", f, err)
		}
		if strings.HasSuffix(f, "-key.pem") && fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", f, fi.Mode().Perm())
		}
	}
	caBefore, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))
	leafBefore, _ := os.ReadFile(filepath.Join(dir, "voyager-api.pem"))

	out := run("--node", "gpu-2=10.0.0.22")
	if !strings.Contains(out, "created "+filepath.Join(dir, "voyager-agent-gpu-2.pem")) || strings.Contains(out, "created "+filepath.Join(dir, "voyager-api.pem")) {
		t.Errorf("second run: %s; want gpu-2's certificate created and the rest kept", out)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "voyager-api.pem")); !bytes.Equal(b, leafBefore) {
		t.Error("a second run changed an existing certificate")
	}

	run("--renew")
	caAfter, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))
	leafAfter, _ := os.ReadFile(filepath.Join(dir, "voyager-api.pem"))
	if !bytes.Equal(caBefore, caAfter) || bytes.Equal(leafBefore, leafAfter) {
		t.Errorf("--renew: CA changed %v, leaf changed %v; want the CA kept and the leaf renewed", !bytes.Equal(caBefore, caAfter), !bytes.Equal(leafBefore, leafAfter))
	}
}

// TestAPIRefusesPlainHTTPOnTheNetwork: voyager api will not serve tokens in
// clear text on an address other hosts reach, and says what to set.
func TestAPIRefusesPlainHTTPOnTheNetwork(t *testing.T) {
	for _, c := range []struct{ addr string }{{"0.0.0.0:7070"}, {"10.0.0.10:443"}} {
		t.Setenv("VOYAGER_ETCD_ENDPOINTS", "https://127.0.0.1:1")
		t.Setenv("VOYAGER_JWT_SECRET", strings.Repeat("s", 40))
		t.Setenv("VOYAGER_HTTP_ADDR", c.addr)
		var out, errb bytes.Buffer
		root := newRootCmd(&out, &errb)
		root.SetArgs([]string{"api"})
		err := root.ExecuteContext(context.Background())
		var code exitCode
		if !errors.As(err, &code) || code != exitUsage || !strings.Contains(errb.String(), "VOYAGER_HTTP_TLS_CERT") {
			t.Errorf("voyager api on %s: %v, stderr %q; want exit 2 naming VOYAGER_HTTP_TLS_CERT", c.addr, err, errb.String())
		}
	}
}
