package main

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
)

// TestProcessFailureExits1E2E: a cluster process that cannot build what
// it runs (its HTTP address is taken) says which process failed and why,
// and exits 1 (runProcess's one failure path), for the placer and the
// API alike.
func TestProcessFailureExits1E2E(t *testing.T) {
	needBinary(t)
	c := etcdtest.Start(t, etcdtest.Options{})
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = taken.Close() })
	environ := []string{"HOME=" + t.TempDir(), "VOYAGER_ETCD_ENDPOINTS=" + c.Server.Endpoint(), "VOYAGER_HTTP_ADDR=" + taken.Addr().String(),
		"VOYAGER_JWT_SECRET=" + strings.Repeat("p", 40)}
	for _, process := range []string{"placer", "api"} {
		p := start(t, environ, process)
		line := p.waitFor(`msg="voyager `+process+` failed"`, 30*time.Second)
		if !strings.Contains(line, taken.Addr().String()) {
			t.Errorf("%s: %q does not name the address it could not listen on", process, line)
		}
		if code := p.waitExit(10 * time.Second); code != exitError {
			t.Errorf("%s: exit code %d, want %d", process, code, exitError)
		}
	}
}
