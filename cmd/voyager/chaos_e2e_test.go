package main

import (
	"bufio"
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

	"github.com/voyager-gpu/voyager/internal/etcdrbac"
	"github.com/voyager-gpu/voyager/state"
)

// The chaos test's agent timings: renewals every 5/3 s, so etcd may stall
// 3.3 s (a loaded machine) without a fence; fence deadline + grace (6 s)
// below the TTL (8 s).
const (
	chaosTTL   = 8 * time.Second
	chaosAfter = 5 * time.Second
	chaosGrace = time.Second
)

// TestChaosE2E: a 3-member etcd (TLS, authentication), a placer and three
// GPU machines, each a network namespace with an agent process on real
// containerd, run seven batch sessions (OnFailure, Never, and short ones)
// while the agents are, in turn, killed with -9 (and started again), paused
// with SIGSTOP past their lease, and cut from etcd (their link down) for
// longer than the fence deadline and shorter than the TTL. Watching etcd's
// history and every container's processes (/proc) all along, it asserts:
//   - no container of a session runs after its binding on that node is gone
//     (the session left the live phases there) plus the fence grace;
//   - no attempt starts twice: one launch per (session, attempt, part), one
//     container per attempt, and no container's processes come back after
//     they were all gone;
//   - every session ends in a final phase or runs;
//   - `voyager check` finds no violation over the whole history.
//
// With VOYAGER_TEST_FENCE_KEEPER=off (no out-of-process fence) it fails:
// the killed and the paused agents' containers run past their bindings.
func TestChaosE2E(t *testing.T) {
	needBinary(t)
	gpus := []string{"gpu-1", "gpu-2", "gpu-3"}
	machines := startMachines(t, []string{"ctl-1"}, gpus)
	c, net, nodes, rt := machines.secureCluster, machines.net, machines.nodes, machines.rt
	machineOf := map[string]string{}
	for i, g := range gpus {
		machineOf[nodes[i]] = g
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	root := c.client(etcdrbac.Root)
	first, err := root.Get(ctx, "/voyager/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	startRev := first.Header.Revision

	rec := recordHistory(t, ctx, root, startRev)
	procs := sampleContainers(t, nodes)
	c.startPlacer(net.ns["ctl-1"], net.ip["ctl-1"]+":7070")
	agents := map[string]*proc{}
	startAgent := func(i int) {
		agents[nodes[i]], _ = c.startAgentTimed(net.ns[gpus[i]], nodes[i], net.ip[gpus[i]], net.ip[gpus[i]]+":7071", rt, fmt.Sprintf("%d-%d", 47300+50*i, 47349+50*i),
			agentTimings{ttl: chaosTTL, fenceAfter: chaosAfter, fenceGrace: chaosGrace, keeper: testFenceKeeper()})
	}
	for i := range gpus {
		startAgent(i)
	}
	for _, p := range agents {
		t.Cleanup(func() { _ = p.cmd.Process.Signal(syscall.SIGCONT) })
	}

	// Seven sessions of one GPU each on six GPUs: five run long, the two
	// short ones take turns on the sixth.
	now := time.Now().UTC()
	var ids []string
	add := func(id string, policy state.RestartPolicy, cmd ...string) {
		s := state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Image: agentTestImage, Command: cmd,
			Resources: state.Resources{GPUs: 1, CPUMilli: 100, MemoryMiB: 64}, Restart: policy,
			Desired: state.DesiredRunning, Created: now}
		if _, err := state.CreateSession(ctx, root, keys, s, now); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	onFailure := state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 3}
	for i := range 3 {
		add(fmt.Sprintf("chaos-of-%d", i), onFailure, "sleep", "3600")
	}
	add("chaos-nv-0", state.RestartPolicy{}, "sleep", "3600")
	add("chaos-nv-1", state.RestartPolicy{}, "sleep", "3600")
	add("chaos-sh-0", state.RestartPolicy{}, "sleep", "3")
	add("chaos-sh-1", onFailure, "sleep", "3")
	// Settled: every session ended, or runs with its container's
	// processes alive where its status says (a status still Running from
	// before a fault's consequences reached etcd does not count).
	settled := func(what string) {
		t.Helper()
		waitAll(t, ctx, root, ids, what, func(st state.Status) bool {
			return st.Phase.Terminal() || st.Phase == state.PhaseRunning && len(st.Nodes) == 1 &&
				procs.alive(st.Nodes[0], fmt.Sprintf("%s-q%d", st.Session, st.QueueRevision))
		})
	}
	settled("every session running or ended")

	// victim picks the machine running the most live sessions.
	victim := func() int {
		count := map[string]int{}
		for _, id := range ids {
			if st, _, err := state.Get[state.Status](ctx, root, keys.Status(id)); err == nil && st.Phase == state.PhaseRunning {
				for _, n := range st.Nodes {
					count[n]++
				}
			}
		}
		best := 0
		for i, n := range nodes {
			if count[n] > count[nodes[best]] {
				best = i
			}
		}
		return best
	}
	// leftNode waits until no live session names node: the placer handled
	// its loss (re-queued or Lost). Only then does the faulty agent come
	// back, so that a container it left running would be seen running
	// past its binding.
	leftNode := func(node string) {
		t.Helper()
		waitAll(t, ctx, root, ids, "every session off "+node, func(st state.Status) bool {
			return st.Phase.Terminal() || !slices.Contains(st.Nodes, node)
		})
	}
	waitGone := func(node string) time.Time {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			r, err := root.Get(ctx, keys.Node(node), clientv3.WithCountOnly())
			if err == nil && r.Count == 0 {
				return time.Now()
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %s still registered 30s into its fault", node)
			}
			time.Sleep(100 * time.Millisecond) // polling, bounded by deadline
		}
	}

	// 1. kill -9, down past the TTL, then started again.
	i := victim()
	killed := time.Now()
	if err := agents[nodes[i]].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	agents[nodes[i]].waitExit(10 * time.Second)
	gone := waitGone(nodes[i])
	t.Logf("kill -9 of %s's agent: the node's lease expired %s later", machineOf[nodes[i]], gone.Sub(killed).Round(time.Millisecond))
	leftNode(nodes[i])
	startAgent(i)
	settled("every session running or ended after the kill")

	// 2. SIGSTOP past the TTL, then SIGCONT.
	i = victim()
	paused := time.Now()
	if err := agents[nodes[i]].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	gone = waitGone(nodes[i])
	t.Logf("SIGSTOP of %s's agent: the node's lease expired %s later", machineOf[nodes[i]], gone.Sub(paused).Round(time.Millisecond))
	leftNode(nodes[i])
	if err := agents[nodes[i]].cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	agents[nodes[i]].waitFor(`msg="node registered"`, 60*time.Second)
	settled("every session running or ended after the pause")

	// 3. Cut from etcd for between the fence deadline and the TTL.
	i = victim()
	m := machineOf[nodes[i]]
	ipCmd(t, "link", "set", net.veth[m], "down")
	cut := time.Now()
	time.Sleep((chaosAfter + chaosTTL) / 2) // the outage itself: its length is the fault
	ipCmd(t, "link", "set", net.veth[m], "up")
	t.Logf("%s cut from etcd for %s", m, time.Since(cut).Round(time.Millisecond))
	agents[nodes[i]].waitFor(`msg="fenced`, 30*time.Second)
	agents[nodes[i]].waitFor(`msg="node registered"`, 60*time.Second)
	settled("every session running or ended after the cut")

	// Every session runs or ended, and nothing runs outside a binding.
	end, err := root.Get(ctx, "/voyager/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, end.Header.Revision)
	procs.close()
	rec.check(t, procs, chaosGrace)

	code, out := runVoyager(t, c.as(etcdrbac.Root), "check", "--start", strconv.FormatInt(startRev, 10), "--end", strconv.FormatInt(end.Header.Revision, 10))
	if code != 0 || !strings.Contains(out, " 0 violations") {
		t.Errorf("voyager check over revisions %d-%d: exit %d\n%s", startRev, end.Header.Revision, code, out)
	} else {
		t.Log(strings.TrimSpace(out))
	}
	for _, id := range ids {
		st, _, _ := state.Get[state.Status](ctx, root, keys.Status(id))
		t.Logf("%s: %s %s attempt %d on %v: %s", id, st.Phase, st.Reason, st.Attempt, st.Nodes, st.Message)
	}
}

// waitAll waits until every session's status satisfies ok.
func waitAll(t *testing.T, ctx context.Context, cli *clientv3.Client, ids []string, what string, ok func(state.Status) bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		var not []string
		for _, id := range ids {
			st, _, err := state.Get[state.Status](ctx, cli, keys.Status(id))
			if err != nil || !ok(st) {
				not = append(not, fmt.Sprintf("%s %s %s %q", id, st.Phase, st.Reason, st.Message))
			}
		}
		if len(not) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 90s: %s", what, strings.Join(not, "; "))
		}
		time.Sleep(200 * time.Millisecond) // polling, bounded by deadline
	}
}

// span is when a binding existed, as the test's watch saw it (end zero:
// it still does).
type span struct {
	attempt    int
	start, end time.Time
}

// chaosHistory is what the test's watch of etcd saw: every binding's span,
// by node, session and queue revision, and every recorded launch.
type chaosHistory struct {
	mu       sync.Mutex
	rev      int64
	bindings map[[2]string]map[int64]*span // (node, session) → queue revision → span
	open     map[[2]string]int64           // (node, session) → queue revision of the live binding
	launches map[string]map[string]bool    // session/attempt/rank → node@binding revision
	reasons  map[string]int                // reasons of statuses that left a node: Fenced, NodeLost…
	err      error
}

func recordHistory(t *testing.T, ctx context.Context, cli *clientv3.Client, from int64) *chaosHistory {
	h := &chaosHistory{bindings: map[[2]string]map[int64]*span{}, open: map[[2]string]int64{}, launches: map[string]map[string]bool{}, reasons: map[string]int{}}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for resp := range cli.Watch(wctx, "/voyager/", clientv3.WithPrefix(), clientv3.WithRev(from+1), clientv3.WithPrevKV()) {
			if err := resp.Err(); err != nil {
				h.mu.Lock()
				h.err = err
				h.mu.Unlock()
				return
			}
			now := time.Now()
			h.mu.Lock()
			for _, ev := range resp.Events {
				h.apply(ev, now)
			}
			h.rev = resp.Header.Revision
			h.mu.Unlock()
		}
	}()
	return h
}

func (h *chaosHistory) apply(ev *clientv3.Event, now time.Time) {
	key := string(ev.Kv.Key)
	switch {
	case strings.HasPrefix(key, keys.AllBindings()):
		parts := strings.Split(strings.TrimPrefix(key, keys.AllBindings()), "/")
		if len(parts) != 2 {
			return
		}
		k := [2]string{parts[0], parts[1]}
		if ev.Type == clientv3.EventTypeDelete {
			if q, ok := h.open[k]; ok {
				h.bindings[k][q].end = now
				delete(h.open, k)
			}
			return
		}
		b, err := state.Decode[state.Binding](ev.Kv.Value)
		if err != nil {
			return
		}
		if h.bindings[k] == nil {
			h.bindings[k] = map[int64]*span{}
		}
		if _, ok := h.bindings[k][b.QueueRevision]; !ok {
			h.bindings[k][b.QueueRevision] = &span{attempt: b.Attempt, start: now}
		}
		h.open[k] = b.QueueRevision
	case strings.HasPrefix(key, keys.StatusDir()) && ev.Type == clientv3.EventTypePut && ev.PrevKv != nil:
		st, err1 := state.Decode[state.Status](ev.Kv.Value)
		prev, err2 := state.Decode[state.Status](ev.PrevKv.Value)
		if err1 == nil && err2 == nil && st.Phase != prev.Phase && (st.Phase == state.PhasePending || st.Phase.Terminal()) && prev.Phase != state.PhasePending {
			h.reasons[string(st.Phase)+"/"+st.Reason]++
		}
	case strings.HasPrefix(key, keys.Parts()) && ev.Type == clientv3.EventTypePut:
		p, err := state.Decode[state.PartStatus](ev.Kv.Value)
		if err != nil || p.Launched == nil {
			return
		}
		a := fmt.Sprintf("%s/attempt %d/rank %d", p.Session, p.Attempt, p.Rank)
		if h.launches[a] == nil {
			h.launches[a] = map[string]bool{}
		}
		h.launches[a][fmt.Sprintf("%s@%d", p.Node, p.BindingRevision)] = true
	}
}

// waitFor waits until the watch has seen revision rev.
func (h *chaosHistory) waitFor(t *testing.T, rev int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		h.mu.Lock()
		seen, err := h.rev, h.err
		h.mu.Unlock()
		if err != nil {
			t.Fatalf("watch the history: %v", err)
		}
		if seen >= rev {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the history watch reached revision %d, not %d, in 30s", seen, rev)
		}
		time.Sleep(20 * time.Millisecond) // polling, bounded by deadline
	}
}

// check asserts the chaos test's rules over the history and the
// containers' processes.
func (h *chaosHistory) check(t *testing.T, procs *containerSampler, grace time.Duration) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	procs.mu.Lock()
	defer procs.mu.Unlock()
	for a, at := range h.launches {
		if len(at) > 1 {
			t.Errorf("attempt started twice: %s launched on %v", a, slices.Sorted(mapKeys(at)))
		}
	}
	perAttempt := map[string][]string{}
	for c, life := range procs.seen {
		node, id := c[0], c[1]
		i := strings.LastIndex(id, "-q")
		q, err := strconv.ParseInt(id[i+2:], 10, 64)
		if i < 0 || err != nil {
			t.Errorf("container %s on %s: not named <session>-q<queue revision>", id, node)
			continue
		}
		sess := id[:i]
		sp := h.bindings[[2]string{node, sess}][q]
		if sp == nil {
			t.Errorf("container %s ran on %s (%s to %s) without ever being bound there", id, node,
				life.first.Format("15:04:05.000"), life.last.Format("15:04:05.000"))
			continue
		}
		if !sp.end.IsZero() && life.last.After(sp.end.Add(grace)) {
			t.Errorf("container %s ran on %s until %s, %s after its binding there went (%s): past the fence grace %s",
				id, node, life.last.Format("15:04:05.000"), life.last.Sub(sp.end).Round(time.Millisecond), sp.end.Format("15:04:05.000"), grace)
		}
		if life.lives > 1 {
			t.Errorf("container %s on %s started %d times (processes never seen before came back after all its earlier ones were gone): %s",
				id, node, life.lives, life)
		} else if len(life.spans) > 1 {
			// The same processes in two spans: one scan of /proc missed
			// them, which is the sampler's gap, not a second start.
			t.Logf("container %s on %s: a scan of /proc missed its processes, which the next one saw again: %s", id, node, life)
		}
		a := fmt.Sprintf("%s/attempt %d", sess, sp.attempt)
		perAttempt[a] = append(perAttempt[a], node+"/"+id)
	}
	for a, cs := range perAttempt {
		if len(cs) > 1 {
			t.Errorf("attempt %s ran in %d containers: %v", a, len(cs), cs)
		}
	}
	t.Logf("history: %d attempts launched, %d containers seen running; sessions leaving their nodes by phase/reason: %v", len(h.launches), len(procs.seen), h.reasons)
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// life is what the sampler saw of one container's processes.
type life struct {
	first, last time.Time
	// lives counts the times its processes appeared after none ran, all
	// of them new: started again. Processes seen before coming back are
	// the same ones, which a scan missed (a new span, not a new life).
	lives int
	alive bool         // at the last sample
	pids  map[int]bool // every process ever seen in it
	spans []procSpan   // the samples' runs in which it had processes
}

// procSpan is one run of samples in which a container had processes.
type procSpan struct {
	first, last time.Time
	pids        []int
}

// String lists the life's spans, for a failure's message.
func (l *life) String() string {
	var b strings.Builder
	for i, sp := range l.spans {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s to %s pids %v", sp.first.Format("15:04:05.000"), sp.last.Format("15:04:05.000"), sp.pids)
	}
	return b.String()
}

// containerSampler scans /proc every 100 ms for the processes of the
// nodes' containers: a process whose cgroup is containerd's
// /<namespace>/<container> with a node's namespace.
type containerSampler struct {
	*sampler
	mu    sync.Mutex
	nodes map[string]bool
	seen  map[[2]string]*life // (node, container) → its life
}

func sampleContainers(t *testing.T, nodes []string) *containerSampler {
	s := &containerSampler{nodes: map[string]bool{}, seen: map[[2]string]*life{}}
	for _, n := range nodes {
		s.nodes[n] = true
	}
	s.sampler = startSampler(t, 100*time.Millisecond, s.sample)
	return s
}

// alive reports whether the last sample saw container id of node running.
func (s *containerSampler) alive(node, id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.seen[[2]string{node, id}]
	return l != nil && l.alive
}

func (s *containerSampler) sample() {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	now := time.Now()
	alive := map[[2]string][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !running(pid) {
			continue
		}
		f, err := os.Open(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := sc.Text()
			j := strings.LastIndexByte(line, ':')
			parts := strings.Split(strings.Trim(line[j+1:], "/"), "/")
			if len(parts) == 2 && s.nodes[parts[0]] {
				c := [2]string{parts[0], parts[1]}
				alive[c] = append(alive[c], pid)
				break
			}
		}
		f.Close()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for c, pids := range alive {
		l := s.seen[c]
		if l == nil {
			l = &life{first: now, pids: map[int]bool{}}
			s.seen[c] = l
		}
		if !l.alive {
			if !slices.ContainsFunc(pids, func(p int) bool { return l.pids[p] }) {
				l.lives++
			}
			l.spans = append(l.spans, procSpan{first: now})
		}
		sp := &l.spans[len(l.spans)-1]
		for _, p := range pids {
			if !l.pids[p] {
				l.pids[p] = true
				sp.pids = append(sp.pids, p)
			}
		}
		sp.last = now
		l.alive, l.last = true, now
	}
	for c, l := range s.seen {
		if alive[c] == nil {
			l.alive = false
		}
	}
}
