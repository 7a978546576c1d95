package nodeagent_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
	"github.com/voyager-gpu/voyager/state"
)

// cuttableClient returns a client of c that reaches it through a proxy the
// test can cut, and the proxy.
func cuttableClient(t *testing.T, c *etcdtest.Cluster) (*clientv3.Client, *etcdtest.Proxy) {
	t.Helper()
	proxy := etcdtest.NewProxy(t, c.Server.Endpoint())
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{proxy.Endpoint()}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli, proxy
}

// cuttable is an agent on the fake runtime that reaches etcd through a
// proxy the test can cut, running one batch session.
type cuttable struct {
	obs     *clientv3.Client // a client that is never cut
	proxy   *etcdtest.Proxy
	rt      *runtime.Fake
	agent   *nodeagent.Agent
	binding state.Binding
}

// startCuttable starts a cuttable agent with lease ttl and the default
// fence timings (TTL/2, TTL/5), binds the batch session id to it and waits
// until it runs.
func startCuttable(t *testing.T, ttl time.Duration, id string) cuttable {
	t.Helper()
	c := etcdtest.Start(t, etcdtest.Options{})
	f := cuttable{obs: c.Client(t), rt: newFake()}
	var cutCli *clientv3.Client
	cutCli, f.proxy = cuttableClient(t, c)
	cfg := testConfig(t, cutCli, f.rt)
	cfg.LeaseTTL, cfg.FenceAfter, cfg.FenceGrace = ttl, 0, 0
	f.agent, _ = runAgent(t, cfg)
	f.binding = bind(t, f.obs, state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Command: []string{"train"}}, state.Binding{})
	waitPhase(t, f.obs, id, state.PhaseRunning, 10*time.Second)
	return f
}

// TestFenceStopsContainersBeforeTheLeaseExpires runs the fencing contract
// on the fake runtime and on real containerd, against a real etcd and a
// real placer.
func TestFenceStopsContainersBeforeTheLeaseExpires(t *testing.T) {
	for _, tc := range []struct {
		name  string
		image string
		rt    func(t *testing.T, gpus []state.GPU) runtime.Runtime
	}{
		{"fake", "busybox", func(*testing.T, []state.GPU) runtime.Runtime { return newFake() }},
		{"containerd", runtimetest.ImageRef, func(t *testing.T, gpus []state.GPU) runtime.Runtime {
			return runtimetest.New(t, runtime.ContainerdOptions{CDISpecDirs: []string{writeCDISpec(t, gpus)}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { testFence(t, tc.image, tc.rt) })
	}
}

// testFence: node gpu-01's agent reaches etcd through a proxy that the test
// cuts, as a partition would. The agent cannot renew its lease; at its
// fence deadline (half the TTL after its last renewal) it stops and
// removes the OnFailure session's container. Only then does etcd expire
// the lease; the placer re-queues the session, binds it to gpu-02, whose
// agent starts it. Sampled all along, the two copies never run together.
// Once the proxy lets traffic through again, gpu-01's agent registers
// anew and runs nothing of the session: its binding there is gone.
func testFence(t *testing.T, image string, newRuntime func(*testing.T, []state.GPU) runtime.Runtime) {
	c := etcdtest.Start(t, etcdtest.Options{})
	obs := c.Client(t)
	cutCli, proxy := cuttableClient(t, c)

	pl := placer.New(obs, placer.Config{ID: "p1", Keys: keys, LeaseTTL: 3 * time.Second, Tick: 200 * time.Millisecond, Logger: quietLogger()})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() { _ = pl.Run(ctx) })

	const ttl = 4 * time.Second
	gpusA, err := nodeagent.SimulatedGPUs(node, "2xA100-80GB")
	if err != nil {
		t.Fatal(err)
	}
	gpusB, err := nodeagent.SimulatedGPUs("gpu-02", "2xA100-80GB")
	if err != nil {
		t.Fatal(err)
	}
	rtA, rtB := newRuntime(t, gpusA), newRuntime(t, gpusB)
	cfgA := testConfig(t, cutCli, rtA)
	cfgA.LeaseTTL, cfgA.Image = ttl, image
	cfgA.FenceAfter, cfgA.FenceGrace = 0, 0 // the defaults: TTL/2 and TTL/5
	a, _ := runAgent(t, cfgA)

	const id = "twice"
	sess := state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Command: []string{"sleep", "1d"}, Desired: state.DesiredRunning,
		Resources: state.Resources{GPUs: 1, CPUMilli: 100, MemoryMiB: 64},
		Restart:   state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 2}, Created: time.Now().UTC()}
	if _, err := state.CreateSession(ctx, obs, keys, sess, sess.Created); err != nil {
		t.Fatal(err)
	}
	if st := waitPhase(t, obs, id, state.PhaseRunning, 30*time.Second); !slices.Equal(st.Nodes, []string{node}) {
		t.Fatalf("running on %v, want %s", st.Nodes, node)
	}

	cfgB := testConfig(t, obs, rtB)
	cfgB.Node, cfgB.LeaseTTL, cfgB.Image, cfgB.GPUs = "gpu-02", ttl, image, gpusB
	cfgB.FenceAfter, cfgB.FenceGrace = 0, 0
	runAgent(t, cfgB)
	waitFor(t, "gpu-02 to register", 10*time.Second, func() (bool, string) { return !gone(t, obs, keys.Node("gpu-02")), "" })

	// Record when gpu-01's node key goes (its lease expired), and sample
	// which runtimes run the session.
	nodeRev, err := obs.Get(ctx, keys.Node(node))
	if err != nil || len(nodeRev.Kvs) == 0 {
		t.Fatalf("node key: %v", err)
	}
	var expired time.Time
	expiredC := make(chan struct{})
	wg.Go(func() {
		for resp := range obs.Watch(ctx, keys.Node(node), clientv3.WithRev(nodeRev.Header.Revision+1)) {
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete {
					expired = time.Now()
					close(expiredC)
					return
				}
			}
		}
	})
	running := func(rt runtime.Runtime) bool {
		infos, err := rt.List(ctx, map[string]string{nodeagent.LabelSession: id})
		return err == nil && slices.ContainsFunc(infos, func(in runtime.Info) bool { return in.State == runtime.StateRunning })
	}
	var mu sync.Mutex
	var stoppedA, startedB time.Time
	both := 0
	sampling := make(chan struct{})
	wg.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-sampling:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			ra, rb := running(rtA), running(rtB)
			now := time.Now()
			mu.Lock()
			if !ra && stoppedA.IsZero() {
				stoppedA = now
			}
			if rb && startedB.IsZero() {
				startedB = now
			}
			if ra && rb {
				both++
			}
			mu.Unlock()
		}
	})

	cut := time.Now()
	proxy.Cut()
	var st state.Status
	waitFor(t, "the session to run on gpu-02", 60*time.Second, func() (bool, string) {
		st, _, err = state.Get[state.Status](ctx, obs, keys.Status(id))
		return err == nil && st.Phase == state.PhaseRunning && slices.Equal(st.Nodes, []string{"gpu-02"}), fmt.Sprintf("%+v %v", st, err)
	})
	waitFor(t, "the sampler to see gpu-02's copy", 10*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return !startedB.IsZero(), ""
	})
	close(sampling)
	<-expiredC
	if !slices.Equal(st.Nodes, []string{"gpu-02"}) || st.Attempt != 1 {
		t.Fatalf("after the cut: %+v; want running on gpu-02, attempt 1", st)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("after the cut: gpu-01 stopped its container in %s, its lease expired in %s (TTL %s), gpu-02 started the session in %s",
		stoppedA.Sub(cut).Round(time.Millisecond), expired.Sub(cut).Round(time.Millisecond), ttl, startedB.Sub(cut).Round(time.Millisecond))
	if a.Fences() < 1 {
		t.Errorf("the cut-off agent did not fence")
	}
	if stoppedA.IsZero() || !stoppedA.Before(expired) {
		t.Errorf("gpu-01's container stopped at %v, the lease expired at %v: want stopped first", stoppedA, expired)
	}
	if !expired.Before(startedB) {
		t.Errorf("gpu-02 started the session at %v, before gpu-01's lease expired at %v", startedB, expired)
	}
	if both > 0 {
		t.Errorf("both nodes ran the session in %d samples", both)
	}

	// Traffic again: gpu-01 registers anew and runs nothing of the session.
	proxy.Restore()
	waitFor(t, "gpu-01 to register again", 30*time.Second, func() (bool, string) {
		return a.Registrations() >= 2 && a.Registered() && !gone(t, obs, keys.Node(node)), ""
	})
	if !gone(t, obs, keys.Binding(node, id)) {
		t.Errorf("gpu-01 still holds a binding of %s", id)
	}
	if infos, err := rtA.List(ctx, nil); err != nil || len(infos) != 0 {
		t.Errorf("gpu-01's runtime holds %+v (%v); want nothing", infos, err)
	}
}

// TestFenceKeepsWhatAlreadyExited: a job that ends while its agent is cut
// off from etcd cannot be released then. The fence stops only what runs,
// so the exited container stays with its exit code, and once etcd answers
// again the next worker reports the job Succeeded; it never runs again.
func TestFenceKeepsWhatAlreadyExited(t *testing.T) {
	f := startCuttable(t, 4*time.Second, "done")
	obs, proxy, rt, a, b := f.obs, f.proxy, f.rt, f.agent, f.binding

	proxy.Cut()
	if err := rt.Finish(nodeagent.ContainerID(b), 0, "trained\n"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a fence", 20*time.Second, func() (bool, string) { return a.Fences() >= 1, "" })
	proxy.Restore()
	st := waitPhase(t, obs, "done", state.PhaseSucceeded, 30*time.Second)
	if st.ExitCode == nil || *st.ExitCode != 0 || rt.Starts() != 1 {
		t.Fatalf("status %+v after %d starts; want Succeeded with exit code 0, started once", st, rt.Starts())
	}
}

// TestAgentRidesOutAnEtcdOutageOfHalfTheFenceDeadline: etcd answers no
// renewal for a while, as during a leader election (one to two election
// timeouts). An agent whose renewals are due every third of its fence
// deadline sits out an outage of half that deadline wherever it falls: just
// after a renewal, or just before the next is due (the worst case, which an
// agent renewing every TTL/3 does not survive). Its running session is not
// fenced, the lease is never given up, and the session keeps its attempt.
func TestAgentRidesOutAnEtcdOutageOfHalfTheFenceDeadline(t *testing.T) {
	// The default fence deadline, TTL/2 = 4.5 s; the outage is 2.25 s.
	f := startCuttable(t, 9*time.Second, "long")
	obs, proxy, rt, a, b := f.obs, f.proxy, f.rt, f.agent, f.binding
	outage := 9 * time.Second / 2 / 2

	// nextRenewal waits for a renewal later than after and returns when it
	// was sent.
	nextRenewal := func(after time.Time) time.Time {
		var r time.Time
		waitFor(t, "a renewal", 10*time.Second, func() (bool, string) {
			r = a.Renewed()
			return r.After(after), fmt.Sprintf("last renewal %v", r)
		})
		return r
	}
	first := nextRenewal(time.Time{})
	second := nextRenewal(first)
	every := second.Sub(first)
	for _, tc := range []struct {
		name string
		at   time.Duration // after a renewal's send
	}{
		{"just after a renewal", 50 * time.Millisecond},
		{"just before the next renewal is due", every - 100*time.Millisecond},
	} {
		last := nextRenewal(time.Now())
		time.Sleep(time.Until(last.Add(tc.at))) // the outage's phase, the point of the test
		proxy.Cut()
		cut := time.Now()
		time.Sleep(outage) // the outage itself
		proxy.Restore()
		renewed := nextRenewal(cut)
		t.Logf("outage %s beginning %s (%s after a renewal sent at %s intervals): the next renewal was sent %s after the cut",
			outage, tc.name, tc.at.Round(time.Millisecond), every.Round(time.Millisecond), renewed.Sub(cut).Round(time.Millisecond))
		if f := a.Fences(); f != 0 {
			t.Fatalf("outage %s: the agent fenced %d times; want none", tc.name, f)
		}
	}
	if n := a.Registrations(); n != 1 {
		t.Errorf("the agent registered %d times; want once, its lease never given up", n)
	}
	st := waitPhase(t, obs, "long", state.PhaseRunning, time.Second)
	infos, err := rt.List(context.Background(), map[string]string{nodeagent.LabelSession: "long"})
	if err != nil || len(infos) != 1 || infos[0].ID != nodeagent.ContainerID(b) || infos[0].State != runtime.StateRunning || st.Attempt != 0 || rt.Starts() != 1 {
		t.Errorf("after the outages: %+v (%v), status %+v, %d starts; want its one container still running, attempt 0", infos, err, st, rt.Starts())
	}
}

// slowStops is a fake runtime whose Stop holds until release closes, and
// which records, at each Start, whether every Stop so far had returned.
type slowStops struct {
	*runtime.Fake
	release  chan struct{}
	mu       sync.Mutex
	stopping int
	early    []string // containers started while a stop was under way
}

func (r *slowStops) Stop(ctx context.Context, id string, grace time.Duration) error {
	r.mu.Lock()
	r.stopping++
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.stopping--
		r.mu.Unlock()
	}()
	select {
	case <-r.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return r.Fake.Stop(ctx, id, grace)
}

func (r *slowStops) Start(ctx context.Context, spec runtime.Spec) error {
	r.mu.Lock()
	if r.stopping > 0 {
		r.early = append(r.early, spec.ID)
	}
	r.mu.Unlock()
	return r.Fake.Start(ctx, spec)
}

// TestAgentRemovesOrphansBeforeStartingBindings: an agent that registers
// while a container with no binding runs on its node (its session was
// re-queued elsewhere while the agent was away) stops that orphan before
// it starts anything for a new binding: the orphan may hold the GPUs the
// new binding was given.
func TestAgentRemovesOrphansBeforeStartingBindings(t *testing.T) {
	cli := etcdtest.New(t)
	rt := &slowStops{Fake: newFake(), release: make(chan struct{})}
	if err := rt.Fake.Start(context.Background(), runtime.Spec{ID: "orphan-q1", Image: "busybox",
		Labels: map[string]string{nodeagent.LabelNode: node, nodeagent.LabelSession: "orphan"}}); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, cli, rt)
	bind(t, cli, state.Session{ID: "fresh", Owner: "ada", Kind: state.KindBatch, Command: []string{"train"}}, state.Binding{GPUs: []string{cfg.GPUs[0].UUID}})
	runAgent(t, cfg)
	waitFor(t, "the orphan's stop to begin", 10*time.Second, func() (bool, string) {
		rt.mu.Lock()
		defer rt.mu.Unlock()
		return rt.stopping > 0, ""
	})
	// Hold the orphan's stop a while: an agent that started bindings
	// beside it would start "fresh" now.
	time.Sleep(300 * time.Millisecond)
	close(rt.release)
	waitPhase(t, cli, "fresh", state.PhaseRunning, 10*time.Second)
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if len(rt.early) > 0 {
		t.Fatalf("started %v while the orphan was still being stopped", rt.early)
	}
	if _, err := rt.Fake.Status(context.Background(), "orphan-q1"); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("orphan: %v; want removed", err)
	}
}

// TestAgentRenewsPastASilentEndpoint: one of the agent's two etcd
// endpoints goes silent without a reset, as a member whose machine lost
// power or whose link was cut does: its connection stays open and carries
// nothing, so a renewal sent on it hangs. The agent's renewals still reach
// etcd through the other endpoint in time, for many renewal intervals: it
// never fences, and its session keeps running.
func TestAgentRenewsPastASilentEndpoint(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	obs := c.Client(t)
	silent, live := etcdtest.NewProxy(t, c.Server.Endpoint()), etcdtest.NewProxy(t, c.Server.Endpoint())
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{silent.Endpoint(), live.Endpoint()}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	rt := newFake()
	cfg := testConfig(t, cli, rt)
	// The default fence deadline, TTL/2 = 3 s, renewed every second.
	cfg.LeaseTTL, cfg.FenceAfter, cfg.FenceGrace = 6*time.Second, 0, 0
	a, _ := runAgent(t, cfg)
	bind(t, obs, state.Session{ID: "steady", Owner: "ada", Kind: state.KindBatch, Command: []string{"train"}}, state.Binding{})
	waitPhase(t, obs, "steady", state.PhaseRunning, 10*time.Second)

	silent.Cut()
	cut := time.Now()
	const span = 12 * time.Second // twelve renewal intervals
	renewals := 0
	for last := a.Renewed(); time.Since(cut) < span; {
		time.Sleep(100 * time.Millisecond) // sampling the agent's renewals
		if r := a.Renewed(); r.After(last) {
			renewals, last = renewals+1, r
		}
		if f := a.Fences(); f != 0 {
			t.Fatalf("the agent fenced %s after one of its two endpoints went silent, after %d renewals", time.Since(cut).Round(time.Millisecond), renewals)
		}
	}
	t.Logf("one endpoint silent for %s: %d renewals, no fence", span, renewals)
	if renewals < int(span/(2*time.Second)) {
		t.Errorf("%d renewals in %s; want at least one every two seconds", renewals, span)
	}
	if st := waitPhase(t, obs, "steady", state.PhaseRunning, time.Second); st.Attempt != 0 || rt.Starts() != 1 || a.Registrations() != 1 {
		t.Errorf("status %+v, %d starts, %d registrations; want running since the first start, one lease", st, rt.Starts(), a.Registrations())
	}
}

// gatedStarts is a fake runtime whose first Start says so on entered and
// then holds until release closes; a create whose caller's context ended
// meanwhile fails, as a containerd create abandoned by its client does.
type gatedStarts struct {
	*runtime.Fake
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (r *gatedStarts) Start(ctx context.Context, spec runtime.Spec) error {
	r.once.Do(func() { close(r.entered) })
	<-r.release
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("create %s: %w", spec.ID, err)
	}
	return r.Fake.Start(ctx, spec)
}

// TestGracefulStopFinishesTheCreateItLaunched: the agent stops gracefully
// between an attempt's launch record and its container's create. The
// create goes on, so the next agent adopts the container and the attempt
// runs: not ended as fenced (its launch recorded with no container), which
// for a session without restarts left is Lost.
func TestGracefulStopFinishesTheCreateItLaunched(t *testing.T) {
	cli := etcdtest.New(t)
	rt := &gatedStarts{Fake: newFake(), entered: make(chan struct{}), release: make(chan struct{})}
	cfg := testConfig(t, cli, rt)
	bind(t, cli, state.Session{ID: "mid", Owner: "ada", Kind: state.KindBatch, Command: []string{"sleep", "1d"}}, state.Binding{})
	first := nodeagent.New(cfg)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()
	select {
	case <-rt.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the agent never created the container")
	}
	if st, _, err := state.Get[state.PartStatus](context.Background(), cli, keys.Part(node, "mid")); err != nil || st.Launched == nil {
		t.Fatalf("part before the create: %+v, %v; want its launch recorded", st, err)
	}
	stop() // the agent's context ends: every worker's with it
	close(rt.release)
	if err := <-done; err != nil {
		t.Fatalf("agent Run: %v", err)
	}
	if _, err := rt.Fake.Status(context.Background(), nodeagent.ContainerID(bindingOf(t, cli, "mid"))); err != nil {
		t.Fatalf("container after the graceful stop: %v; want it created", err)
	}
	second, _ := runAgent(t, cfg)
	st := waitPhase(t, cli, "mid", state.PhaseRunning, 10*time.Second)
	if b := bindingOf(t, cli, "mid"); st.Attempt != b.Attempt || second.FencedAttempts() != 0 || rt.Starts() != 1 {
		t.Errorf("status %s attempt %d, %d attempts fenced, %d creates; want the binding's attempt %d adopted, none fenced, one create",
			st.Phase, st.Attempt, second.FencedAttempts(), rt.Starts(), b.Attempt)
	}
}
