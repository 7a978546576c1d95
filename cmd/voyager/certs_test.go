package main

import (
	"bytes"
	"context"
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
