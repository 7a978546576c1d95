package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

var keys = state.MustKeys(state.DefaultPrefix)

// submit creates a one-GPU batch session the way the API does.
func submit(t *testing.T, ctx context.Context, cli *clientv3.Client) string {
	t.Helper()
	now := time.Now().UTC()
	id, err := state.NewSessionID(now)
	if err != nil {
		t.Fatal(err)
	}
	s := state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Desired: state.DesiredRunning, Created: now,
		Resources: state.Resources{GPUs: 1, CPUMilli: 1000, MemoryMiB: 1024}}
	if _, err := state.CreateSession(ctx, cli, keys, s, now); err != nil {
		t.Fatal(err)
	}
	return id
}

// waitStatus polls the session's status until ok accepts it.
func waitStatus(t *testing.T, ctx context.Context, cli *clientv3.Client, id, what string, ok func(state.Status) bool) state.Status {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, _, err := state.Get[state.Status](ctx, cli, keys.Status(id))
		if err == nil && ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %s: no %s within 20s; last status %+v (err %v)", id, what, st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sessionWaitsForNodes submits a session to a Voyager without nodes and
// expects the placer to say so.
func sessionWaitsForNodes(t *testing.T, ctx context.Context, cli *clientv3.Client) {
	t.Helper()
	id := submit(t, ctx, cli)
	waitStatus(t, ctx, cli, id, "reason from the placer", func(st state.Status) bool {
		return st.Reason == "Capacity" && strings.Contains(st.Message, "no nodes are registered")
	})
}

// addNode registers a simulated 8-GPU node under a lease kept alive for
// the rest of the test.
func addNode(t *testing.T, ctx context.Context, cli *clientv3.Client, name string) {
	t.Helper()
	n := state.Node{Name: name, CPUMilli: 64000, MemoryMiB: 256000, Simulated: true, Ports: state.PortRange{First: 41000, Last: 41099}}
	for i := 0; i < 8; i++ {
		n.GPUs = append(n.GPUs, state.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", name, i), Model: "simulated A100", MemoryMiB: 81920, Healthy: true})
	}
	lease, err := cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	ka, err := cli.KeepAlive(ctx, lease.ID)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for range ka {
		}
	}()
	v, _ := state.Encode(n)
	if _, err := cli.Put(ctx, keys.Node(name), v, clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
}

// TestPlacerE2E runs `voyager placer` processes against a real etcd: one
// binds, is killed with SIGKILL mid-life, and a second one carries on
// without anything stranded; SIGTERM then stops it cleanly and its
// membership key goes at once.
func TestPlacerE2E(t *testing.T) {
	needBinary(t)
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	addNode(t, ctx, cli, "sim-1")
	environ := []string{"HOME=" + t.TempDir(), "VOYAGER_ETCD_ENDPOINTS=" + c.Server.Endpoint(), "VOYAGER_PLACER_LEASE_TTL=2s", "VOYAGER_LOG_LEVEL=debug"}

	p1 := start(t, append(environ, "VOYAGER_HTTP_ADDR="+etcdtest.FreeAddr(t)), "placer")
	p1.waitFor(`msg="placer caches synced"`, 30*time.Second)
	first := submit(t, ctx, cli)
	st := waitStatus(t, ctx, cli, first, "binding", func(st state.Status) bool { return st.Phase == state.PhaseBound })
	if len(st.Nodes) != 1 || st.Nodes[0] != "sim-1" {
		t.Errorf("bound to %v, want sim-1", st.Nodes)
	}

	// SIGKILL: no clean-up at all. Its lease outlives it for the TTL.
	if err := p1.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p1.waitExit(10 * time.Second)
	second := submit(t, ctx, cli)
	p2 := start(t, append(environ, "VOYAGER_HTTP_ADDR="+etcdtest.FreeAddr(t)), "placer")
	waitStatus(t, ctx, cli, second, "binding by the second placer", func(st state.Status) bool { return st.Phase == state.PhaseBound })
	l, _, err := state.Get[state.Ledger](ctx, cli, keys.Ledger("sim-1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(l.GPUOwners()) != 2 {
		t.Errorf("ledger holds %d GPUs, want 2 (one per session, none twice): %+v", len(l.GPUOwners()), l)
	}

	if code := p2.stop(); code != 0 {
		t.Fatalf("placer exit code %d after SIGTERM, want 0", code)
	}
	// The first placer's key lapses with its lease; the second revoked its
	// own on the way out.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := cli.Get(ctx, keys.Placers(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d placer keys remain after both placers stopped", resp.Count)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPlacerNeedsEndpointsE2E: without VOYAGER_ETCD_ENDPOINTS the placer
// says how to set it and exits 2.
func TestPlacerNeedsEndpointsE2E(t *testing.T) {
	needBinary(t)
	p := start(t, []string{"HOME=" + t.TempDir()}, "placer")
	line := p.waitFor("VOYAGER_ETCD_ENDPOINTS", 10*time.Second)
	if code := p.waitExit(10 * time.Second); code != exitUsage {
		t.Errorf("exit code %d, want %d", code, exitUsage)
	}
	if !strings.Contains(line, "http://") {
		t.Errorf("message %q does not show an example URL", line)
	}
}
