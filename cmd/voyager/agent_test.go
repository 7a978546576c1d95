package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/internal/testreq"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

const agentTestImage = "voyager.local/busybox:e2e"

// agentTimings are an agent's lease TTL, fence deadline and fence grace
// (zero: the agent's default) and its fence keeper ("": the default).
type agentTimings struct {
	ttl, fenceAfter, fenceGrace time.Duration
	keeper                      string
}

// environ is the agent's settings for tm.
func (tm agentTimings) environ() []string {
	var env []string
	for _, s := range []struct {
		name string
		d    time.Duration
	}{{"VOYAGER_AGENT_LEASE_TTL", tm.ttl}, {"VOYAGER_AGENT_FENCE_AFTER", tm.fenceAfter}, {"VOYAGER_AGENT_FENCE_GRACE", tm.fenceGrace}} {
		if s.d > 0 {
			env = append(env, s.name+"="+s.d.String())
		}
	}
	if tm.keeper != "" {
		env = append(env, "VOYAGER_AGENT_FENCE_KEEPER="+tm.keeper)
	}
	return env
}

// localAgentEnv is the environment of a voyager agent process on this
// machine, without TLS, to add to its etcd settings: node at 127.0.0.1,
// its data under home, its sessions in namespace ns of the containerd at
// containerd, two simulated GPUs, the test image, the lease and fence
// timings tm, and a session network of its own.
func localAgentEnv(t *testing.T, home, node, containerd, ns string, tm agentTimings) []string {
	return append([]string{"VOYAGER_DATA_DIR=" + home + "/data",
		"VOYAGER_AGENT_NODE=" + node, "VOYAGER_AGENT_ADDRESS=127.0.0.1",
		"VOYAGER_AGENT_CONTAINERD=" + containerd, "VOYAGER_AGENT_NAMESPACE=" + ns,
		"VOYAGER_AGENT_SIMULATE_GPUS=2xA100-80GB", "VOYAGER_AGENT_IMAGE=" + agentTestImage, "VOYAGER_AGENT_STOP_GRACE=1s",
		"VOYAGER_AGENT_NETWORK_NAME=" + sessionNetwork(t)}, tm.environ()...)
}

// privateContainerd starts a containerd for one test, or skips the test
// where that cannot be (not root, containerd or busybox-static missing;
// a failure where testreq.Env requires them).
func privateContainerd(t *testing.T, namespace string) *runtime.Containerd {
	t.Helper()
	if os.Geteuid() != 0 {
		testreq.Missing(t, "root", "needs root to run containerd")
	}
	if _, err := exec.LookPath("containerd"); err != nil {
		testreq.Missing(t, "containerd", "apt-get install containerd runc")
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		testreq.Missing(t, "busybox-static", "apt-get install busybox-static")
	}
	dir, err := os.MkdirTemp("", "vctrd")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d, err := runtime.StartContainerd(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = d.Stop(10 * time.Second)
		_ = os.RemoveAll(dir)
	})
	return namespaceRuntime(t, d.Address, namespace)
}

// namespaceRuntime is a client of the containerd at address for namespace,
// with the test image imported there. At cleanup (before the daemon
// stops) it removes the namespace's containers and the (empty) parent
// cgroup runc leaves behind.
func namespaceRuntime(t *testing.T, address, namespace string) *runtime.Containerd {
	t.Helper()
	ctx := context.Background()
	rt, err := runtime.NewContainerd(ctx, runtime.ContainerdOptions{Address: address, Namespace: namespace})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		infos, _ := rt.List(ctx, nil)
		for _, in := range infos {
			_ = rt.Remove(ctx, in.ID)
		}
		_ = rt.Close()
		cgroups, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", namespace))
		for _, cg := range cgroups {
			_ = syscall.Rmdir(cg)
		}
	})
	var buf bytes.Buffer
	if err := runtime.WriteBusyboxImage(&buf, "/bin/busybox", agentTestImage); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Import(ctx, &buf); err != nil {
		t.Fatal(err)
	}
	return rt
}

// containers lists the ids and pids of the namespace's containers.
func containers(t *testing.T, rt *runtime.Containerd) []string {
	t.Helper()
	infos, err := rt.List(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, in := range infos {
		out = append(out, fmt.Sprintf("%s pid=%d %s", in.ID, in.Pid, in.State))
	}
	return out
}

// TestAgentKillE2E: SIGKILL the agent while sessions run and start it
// again (within its fence deadline): the same containers, no duplicates.
// Keep it down longer than its lease: its fence keeper stops the
// containers before the lease expires, the node disappears, the placer
// marks its sessions Lost, and the agent, back, removes their containers.
func TestAgentKillE2E(t *testing.T) {
	needBinary(t)
	rt := privateContainerd(t, "voyager-e2e")
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	home := t.TempDir()
	base := []string{"HOME=" + home, "VOYAGER_ETCD_ENDPOINTS=" + c.Server.Endpoint(), "VOYAGER_PLACER_LEASE_TTL=2s", "VOYAGER_LOG_LEVEL=debug"}
	agentEnv := append(slices.Clone(base), localAgentEnv(t, home, "e2e-node", rt.Address(), rt.Namespace(),
		agentTimings{ttl: 6 * time.Second, fenceAfter: 4 * time.Second, fenceGrace: 500 * time.Millisecond, keeper: testFenceKeeper()})...)
	startAgent := func() *proc {
		p := start(t, append(slices.Clone(agentEnv), "VOYAGER_HTTP_ADDR="+etcdtest.FreeAddr(t)), "agent")
		p.waitFor(`msg="node registered"`, 30*time.Second)
		return p
	}
	pl := start(t, append(slices.Clone(base), "VOYAGER_HTTP_ADDR="+etcdtest.FreeAddr(t)), "placer")
	pl.waitFor(`msg="placer caches synced"`, 30*time.Second)
	agent := startAgent()
	if !strings.Contains(agent.stderr(), "GPU inventory is SIMULATED") {
		t.Fatal("no simulated-inventory warning")
	}

	ids := []string{"s-kill-a", "s-kill-b"}
	now := time.Now().UTC()
	for _, id := range ids {
		s := state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Image: agentTestImage, Command: []string{"sleep", "3600"},
			Resources: state.Resources{GPUs: 1, CPUMilli: 100, MemoryMiB: 64}, Desired: state.DesiredRunning, Created: now}
		if _, err := state.CreateSession(ctx, cli, keys, s, now); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		waitStatus(t, ctx, cli, id, "Running", func(st state.Status) bool { return st.Phase == state.PhaseRunning })
	}
	before := containers(t, rt)
	if len(before) != 2 {
		t.Fatalf("containers %v; want 2", before)
	}

	// kill -9 and start again: adopted, not duplicated.
	if err := agent.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	agent.waitExit(10 * time.Second)
	agent = startAgent()
	agent.waitFor("adopted running container", 30*time.Second)
	agent.waitFor("adopted running container", 30*time.Second)
	if after := containers(t, rt); !slices.Equal(after, before) {
		t.Fatalf("after restart: %v; want the same %v", after, before)
	}
	for _, id := range ids {
		waitStatus(t, ctx, cli, id, "still Running", func(st state.Status) bool { return st.Phase == state.PhaseRunning })
	}
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", agent.cmd.Process.Pid)); err == nil {
		for _, l := range strings.Split(string(st), "\n") {
			if strings.HasPrefix(l, "VmRSS:") {
				t.Logf("agent process at rest with %d sessions (race build: %v): %s", len(ids), raceEnabled, strings.Join(strings.Fields(l), " "))
			}
		}
	}

	// kill -9 and stay down past the TTL: the node goes, the sessions Lost.
	if err := agent.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	agent.waitExit(10 * time.Second)
	for _, id := range ids {
		waitStatus(t, ctx, cli, id, "Lost", func(st state.Status) bool { return st.Phase == state.PhaseLost })
	}
	if resp, _ := cli.Get(ctx, keys.Node("e2e-node")); len(resp.Kvs) != 0 {
		t.Fatal("the node record outlived its lease")
	}
	// Stopped by the fence keeper at the fence deadline, before the lease
	// expired (kept, with their fence records, for the agent to report).
	if got := containers(t, rt); len(got) != 2 || slices.ContainsFunc(got, func(c string) bool { return !strings.HasSuffix(c, " stopped") }) {
		t.Fatalf("containers while the agent is down past its lease: %v; want both stopped by its fence keeper", got)
	}
	// Back, the agent finds no bindings for them: no orphan survives.
	agent = startAgent()
	deadline := time.Now().Add(30 * time.Second)
	for len(containers(t, rt)) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("orphans left: %v", containers(t, rt))
		}
		time.Sleep(100 * time.Millisecond) // polling, bounded by deadline
	}
	if code := agent.stop(); code != 0 {
		t.Errorf("agent exit code %d after SIGTERM", code)
	}
	pl.stop()
}

// TestSimulatedCDISpecPerInstance: two agents on one machine (one node
// name, other data directories) write their simulated GPUs' CDI specs to
// directories of their own, so that one never rewrites the other's.
func TestSimulatedCDISpecPerInstance(t *testing.T) {
	a := config.Config{AgentNamespace: "voyager", DataDir: t.TempDir()}
	b := config.Config{AgentNamespace: "voyager", DataDir: t.TempDir()}
	ia, ib := agentInstance("gpu-01", a), agentInstance("gpu-01", b)
	if ia == ib {
		t.Fatalf("two data directories give one instance name %q", ia)
	}
	if again := agentInstance("gpu-01", a); again != ia {
		t.Fatalf("instance name not stable: %q then %q", ia, again)
	}
	ga, gb := simulatedGPUs(t, "1xA100-80GB"), simulatedGPUs(t, "2xH100-80GB")
	da, err := writeSimulatedCDISpec(ia, ga)
	if err != nil {
		t.Fatal(err)
	}
	db, err := writeSimulatedCDISpec(ib, gb)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(da); _ = os.RemoveAll(db) })
	if da == db {
		t.Fatalf("both instances write to %s", da)
	}
	sa, _ := os.ReadFile(filepath.Join(da, "voyager-simulated.yaml"))
	sb, _ := os.ReadFile(filepath.Join(db, "voyager-simulated.yaml"))
	if strings.Count(string(sa), "- name:") != 1 || strings.Count(string(sb), "- name:") != 2 {
		t.Fatalf("specs after both wrote:\n%s\n---\n%s", sa, sb)
	}
}

func simulatedGPUs(t *testing.T, spec string) []state.GPU {
	t.Helper()
	g, err := nodeagent.SimulatedGPUs("gpu-01", spec)
	if err != nil {
		t.Fatal(err)
	}
	return g
}
