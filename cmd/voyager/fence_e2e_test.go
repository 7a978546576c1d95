package main

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// testFenceKeeper is what the fencing end-to-end tests set
// VOYAGER_AGENT_FENCE_KEEPER to: spawn, unless VOYAGER_TEST_FENCE_KEEPER
// says otherwise. VOYAGER_TEST_FENCE_KEEPER=off runs them without the
// out-of-process fence, to show that they then fail.
func testFenceKeeper() string { return cmp.Or(os.Getenv("VOYAGER_TEST_FENCE_KEEPER"), "spawn") }

// running reports whether process pid exists and has not exited (a
// container's init: once it is gone, so is everything of its container).
func running(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// sampler calls a sample function at once and then every period, in a
// goroutine, until close (at the latest when the test ends).
type sampler struct {
	stop, done chan struct{}
}

func startSampler(t *testing.T, period time.Duration, sample func()) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			sample()
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(s.close)
	return s
}

// close stops the sampling and waits for the last sample to end. It may
// be called more than once.
func (s *sampler) close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// pidSampler records, every 20 ms, the last time any of its processes was
// seen running. It reads /proc, never containerd, which a case hangs.
type pidSampler struct {
	*sampler
	mu    sync.Mutex
	pids  []int
	last  time.Time // the last sample that saw a process running
	taken time.Time // the last sample
}

func samplePIDs(t *testing.T, pids ...int) *pidSampler {
	s := &pidSampler{pids: pids}
	s.sampler = startSampler(t, 20*time.Millisecond, func() {
		now := time.Now()
		s.mu.Lock()
		if slices.ContainsFunc(s.pids, running) {
			s.last = now
		}
		s.taken = now
		s.mu.Unlock()
	})
	return s
}

// lastRunningUpTo waits for a sample taken after t and returns when a
// process was last seen running.
func (s *pidSampler) lastRunningUpTo(tb testing.TB, t time.Time) time.Time {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.mu.Lock()
		taken, last := s.taken, s.last
		s.mu.Unlock()
		if taken.After(t) {
			return last
		}
		if time.Now().After(deadline) {
			tb.Fatalf("no sample after %s within 10s", t.Format(time.RFC3339Nano))
		}
		time.Sleep(10 * time.Millisecond) // polling, bounded by deadline
	}
}

// TestFenceWithoutTheAgentE2E: a real agent process on a private
// containerd, a real placer, etcd reached by the agent through a proxy.
// A batch session runs (busybox sleep as the container's init, which
// ignores SIGTERM: only the SIGKILL after the fence grace ends it). Then
// the agent cannot fence its node itself:
//   - kill-9: the agent is killed;
//   - sigstop: the agent is paused past its lease;
//   - hung-containerd: etcd is cut off and containerd paused, so the
//     agent's own fence hangs in its first containerd call.
//
// Asserted, from /proc (not containerd): the container's process is gone
// before the node's lease expires in etcd (so before any placer can
// re-queue the session), the session ends Lost, and nothing of it runs
// once the agent is back. With VOYAGER_TEST_FENCE_KEEPER=off every case
// fails: the container runs on past the lease.
func TestFenceWithoutTheAgentE2E(t *testing.T) {
	needBinary(t)
	for _, fault := range []string{"kill-9", "sigstop", "hung-containerd"} {
		t.Run(fault, func(t *testing.T) { testFenceWithoutTheAgent(t, fault) })
	}
}

func testFenceWithoutTheAgent(t *testing.T, fault string) {
	const (
		ttl   = 4 * time.Second
		after = 2 * time.Second
		grace = 500 * time.Millisecond
	)
	dir, err := os.MkdirTemp("", "vctrd")
	if err != nil {
		t.Fatal(err)
	}
	d, err := runtime.StartContainerd(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(d.PID(), syscall.SIGCONT)
		_ = d.Stop(10 * time.Second)
		_ = os.RemoveAll(dir)
	})
	ns := fmt.Sprintf("vfence-%d-%s", os.Getpid(), fault)
	rt := namespaceRuntime(t, d.Address, ns)
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	proxy := etcdtest.NewProxy(t, c.Server.Endpoint())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	home := t.TempDir()
	base := []string{"HOME=" + home, "VOYAGER_PLACER_LEASE_TTL=2s", "VOYAGER_LOG_LEVEL=debug"}
	pl := start(t, append(slices.Clone(base), "VOYAGER_ETCD_ENDPOINTS="+c.Server.Endpoint(), "VOYAGER_HTTP_ADDR="+etcdtest.FreeAddr(t)), "placer")
	pl.waitFor(`msg="placer caches synced"`, 30*time.Second)
	node := "fence-" + fault
	agent := start(t, append(append(slices.Clone(base),
		"VOYAGER_ETCD_ENDPOINTS="+proxy.Endpoint(), "VOYAGER_ETCD_DIAL_TIMEOUT=1s", "VOYAGER_HTTP_ADDR="+etcdtest.FreeAddr(t)),
		localAgentEnv(t, home, node, d.Address, ns, agentTimings{ttl: ttl, fenceAfter: after, fenceGrace: grace, keeper: testFenceKeeper()})...), "agent")
	agent.waitFor(`msg="node registered"`, 30*time.Second)
	t.Cleanup(func() { _ = agent.cmd.Process.Signal(syscall.SIGCONT) })

	id := "s-" + fault
	now := time.Now().UTC()
	s := state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Image: agentTestImage, Command: []string{"sleep", "3600"},
		Resources: state.Resources{GPUs: 1, CPUMilli: 100, MemoryMiB: 64}, Desired: state.DesiredRunning, Created: now}
	if _, err := state.CreateSession(ctx, cli, keys, s, now); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, ctx, cli, id, "Running", func(st state.Status) bool { return st.Phase == state.PhaseRunning })
	infos, err := rt.List(ctx, nil)
	if err != nil || len(infos) != 1 || infos[0].Pid <= 0 {
		t.Fatalf("containers %+v (%v); want the session's one, running", infos, err)
	}
	pid := int(infos[0].Pid)
	samples := samplePIDs(t, pid)

	nodeKey, err := cli.Get(ctx, keys.Node(node))
	if err != nil || len(nodeKey.Kvs) == 0 {
		t.Fatalf("node key: %v", err)
	}
	expired := make(chan time.Time, 1)
	go func() {
		for resp := range cli.Watch(ctx, keys.Node(node), clientv3.WithRev(nodeKey.Header.Revision+1)) {
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete {
					expired <- time.Now()
					return
				}
			}
		}
	}()

	faulted := time.Now()
	switch fault {
	case "kill-9":
		if err := agent.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
	case "sigstop":
		if err := agent.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	case "hung-containerd":
		if err := syscall.Kill(d.PID(), syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		proxy.Cut()
	}
	var exp time.Time
	select {
	case exp = <-expired:
	case <-time.After(30 * time.Second):
		t.Fatal("the node's lease did not expire within 30s of the fault")
	}
	last := samples.lastRunningUpTo(t, exp.Add(grace))
	t.Logf("%s (keeper %s): container last seen running %s after the fault; the lease expired %s after it",
		fault, testFenceKeeper(), last.Sub(faulted).Round(time.Millisecond), exp.Sub(faulted).Round(time.Millisecond))
	if !last.Before(exp) {
		t.Errorf("%s: the session's container ran %s past its node's lease (it was last seen %s after the fault, the lease expired %s after it): it would run beside its re-queued copy",
			fault, last.Sub(exp).Round(time.Millisecond), last.Sub(faulted).Round(time.Millisecond), exp.Sub(faulted).Round(time.Millisecond))
	}

	// Recovery: the session is Lost (placer), and once the agent is back
	// nothing of it runs.
	waitStatus(t, ctx, cli, id, "Lost", func(st state.Status) bool { return st.Phase == state.PhaseLost })
	switch fault {
	case "sigstop":
		_ = agent.cmd.Process.Signal(syscall.SIGCONT)
	case "hung-containerd":
		_ = syscall.Kill(d.PID(), syscall.SIGCONT)
		proxy.Restore()
	case "kill-9":
		agent.waitExit(10 * time.Second)
		if testFenceKeeper() == "spawn" {
			waitKeeperExit(t, filepath.Join(home, "data", "fence"))
		}
	}
	if fault != "kill-9" {
		agent.waitFor(`msg="node registered"`, 30*time.Second)
		deadline := time.Now().Add(30 * time.Second)
		for {
			infos, err := rt.List(ctx, nil)
			if err == nil && len(infos) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("containers left after the agent came back: %v (%v)", infos, err)
			}
			time.Sleep(100 * time.Millisecond) // polling, bounded by deadline
		}
	}
	samples.close()
	if running(pid) {
		t.Errorf("the session's container (pid %d) runs at the end", pid)
	}
	pl.stop()
}

// waitKeeperExit waits for the fence keeper of dir (its pid in the lock
// file) to exit: a keeper that an agent started does not outlive its use.
func waitKeeperExit(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "keeper.lock"))
	if err != nil {
		t.Fatalf("read the keeper's lock: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("keeper pid %q: %v", b, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for running(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("the fence keeper (pid %d) still runs 30s after its agent died with nothing left to fence", pid)
		}
		time.Sleep(50 * time.Millisecond) // polling, bounded by deadline
	}
}
