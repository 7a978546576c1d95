package lifecycle

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/merger"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
	"github.com/voyager-gpu/voyager/state"
)

// chain is a whole control plane on a real etcd: a placer, the lifecycle
// controller (sharing their caches) and one node agent (8 simulated GPUs) over the Fake runtime,
// so that tests end batch jobs when they choose.
type chain struct {
	t   testing.TB
	cli *clientv3.Client
	rt  *runtime.Fake
	ctl *Controller
}

const chainNode = "gpu-01"

func newChain(t testing.TB, cfg ControllerConfig, agentOpts ...func(*nodeagent.Config)) *chain {
	t.Helper()
	cli := etcdtest.Start(t, etcdtest.Options{}).Client(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	var done []chan error
	run := func(f func(context.Context) error) {
		ch := make(chan error, 1)
		done = append(done, ch)
		go func() { ch <- f(ctx) }()
	}
	t.Cleanup(func() {
		cancel()
		for _, ch := range done {
			if err := <-ch; err != nil {
				t.Errorf("run: %v", err)
			}
		}
	})
	rt := runtime.NewFake(nil, "busybox")
	gpus, err := nodeagent.SimulatedGPUs(chainNode, "8xA100-80GB")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	first, last, err := config.ParsePortRange(runtimetest.FreePortRange(t, 100))
	if err != nil {
		t.Fatal(err)
	}
	ports := state.PortRange{First: first, Last: last}
	acfg := nodeagent.Config{
		Node: chainNode, Address: "127.0.0.1", Keys: keys, Client: cli, Runtime: rt,
		GPUs: gpus, Simulated: true, CPUMilli: 64000, MemoryMiB: 1 << 18,
		// serveJupyter listens on these: above the ephemeral range, where
		// another test's outgoing connection could hold one (41000 did).
		Ports: ports, LeaseTTL: 5 * time.Second,
		Image: "busybox", HomeDir: dir + "/home", LogDir: dir + "/logs", StopGrace: 100 * time.Millisecond,
		RestartBackoff: 100 * time.Millisecond, RestartBackoffMax: time.Second,
		Logger: quiet, Resync: time.Second,
	}
	for _, o := range agentOpts {
		o(&acfg)
	}
	run(nodeagent.New(acfg).Run)
	// The placer and the controller share the caches of the queue, nodes,
	// ledgers, cordons, quotas and warnings, as in `voyager placer`; they
	// run once both have added their handlers.
	shared := placer.NewSharedCaches(cli, keys, quiet)
	pl := placer.New(cli, placer.Config{Keys: keys, Logger: quiet, Tick: 200 * time.Millisecond, Shared: shared})
	run(pl.Run)
	run(merger.New(cli, merger.Config{Keys: keys, Logger: quiet}).Run)
	cfg.Keys, cfg.Logger, cfg.Shared = keys, quiet, shared
	if cfg.Every == 0 {
		cfg.Every = 50 * time.Millisecond
	}
	ctl := NewController(cli, cfg)
	run(ctl.Run)
	run(shared.Run)
	return &chain{t: t, cli: cli, rt: rt, ctl: ctl}
}

// submit creates a batch session as the API would.
func (c *chain) submit(id string, gpus, priority int, preemptible bool, mut func(*state.Session)) {
	c.t.Helper()
	now := time.Now().UTC()
	s := state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Command: []string{"train"},
		Resources: state.Resources{GPUs: gpus, CPUMilli: 1000, MemoryMiB: 1024},
		Priority:  priority, Preemptible: preemptible, Desired: state.DesiredRunning, Created: now}
	if mut != nil {
		mut(&s)
	}
	if _, err := state.CreateSession(context.Background(), c.cli, keys, s, now); err != nil {
		c.t.Fatal(err)
	}
}

// phase waits until session id's status satisfies cond.
func (c *chain) status(id, what string, cond func(state.Status) bool) state.Status {
	c.t.Helper()
	st, _ := waitKey(c.t, c.cli, keys.Status(id), id+" "+what, func(st state.Status, found bool) bool { return found && cond(st) })
	return st
}

func (c *chain) running(id string) state.Status {
	c.t.Helper()
	return c.status(id, "running", func(st state.Status) bool { return st.Phase == state.PhaseRunning })
}

// container returns the id of session id's running container.
func (c *chain) container(id string) string {
	c.t.Helper()
	infos, err := c.rt.List(context.Background(), map[string]string{nodeagent.LabelSession: id})
	if err != nil || len(infos) != 1 {
		c.t.Fatalf("containers of %s: %v %v", id, infos, err)
	}
	return infos[0].ID
}

func (c *chain) finish(id string, code int) {
	c.t.Helper()
	if err := c.rt.Finish(c.container(id), code, "done\n"); err != nil {
		c.t.Fatal(err)
	}
}

// watchStatus records every value session id's status takes from now on;
// the returned function gives them so far.
func (c *chain) watchStatus(id string) func() []state.Status {
	key := keys.Status(id)
	return recordValues(c, key, false, func(ev *clientv3.Event) (state.Status, bool) {
		st, err := state.Decode[state.Status](ev.Kv.Value)
		return st, err == nil && ev.Type == clientv3.EventTypePut
	})
}

// watchParts records every value session id's parts (its agents' reports,
// parts/<node>/<id>) take from now on; the returned function gives them so
// far.
func (c *chain) watchParts(id string) func() []state.PartStatus {
	return recordValues(c, keys.Parts(), true, func(ev *clientv3.Event) (state.PartStatus, bool) {
		if !strings.HasSuffix(string(ev.Kv.Key), "/"+id) || ev.Type != clientv3.EventTypePut {
			return state.PartStatus{}, false
		}
		p, err := state.Decode[state.PartStatus](ev.Kv.Value)
		return p, err == nil
	})
}

// recordValues records what keep takes from every change of key (a
// prefix when prefix is set) from now on: the watch starts at the
// revision after a read made here, so nothing written after the call is
// missed. The returned function gives the values so far, once the
// recorder has seen every revision etcd had when it was called (it asks
// for a progress report, so a quiet key does not keep it waiting).
func recordValues[T any](c *chain, key string, prefix bool, keep func(*clientv3.Event) (T, bool)) func() []T {
	c.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c.t.Cleanup(cancel)
	r, err := c.cli.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil {
		c.t.Fatal(err)
	}
	opts := []clientv3.OpOption{clientv3.WithRev(r.Header.Revision + 1), clientv3.WithProgressNotify()}
	if prefix {
		opts = append(opts, clientv3.WithPrefix())
	}
	var mu sync.Mutex
	seen, upTo := []T(nil), r.Header.Revision
	wch := c.cli.Watch(ctx, key, opts...)
	go func() {
		for resp := range wch {
			mu.Lock()
			for _, ev := range resp.Events {
				if v, ok := keep(ev); ok {
					seen = append(seen, v)
				}
			}
			upTo = max(upTo, resp.Header.Revision)
			mu.Unlock()
		}
	}()
	return func() []T {
		c.t.Helper()
		now, err := c.cli.Get(context.Background(), key, clientv3.WithCountOnly())
		if err != nil {
			c.t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			mu.Lock()
			caught := upTo >= now.Header.Revision
			mu.Unlock()
			if caught {
				break
			}
			if time.Now().After(deadline) {
				c.t.Fatalf("the recorder of %s did not reach revision %d", key, now.Header.Revision)
			}
			_ = c.cli.RequestProgress(ctx)
			time.Sleep(20 * time.Millisecond) // waiting for the watch's progress report
		}
		mu.Lock()
		defer mu.Unlock()
		return append([]T(nil), seen...)
	}
}

func warned(t testing.TB, cli *clientv3.Client, id string) bool {
	r, err := cli.Get(context.Background(), keys.Warning(id))
	if err != nil {
		t.Fatal(err)
	}
	return len(r.Kvs) > 0
}

func TestPreemptionPicksFewestVictimsAndRequeuesThem(t *testing.T) {
	c := newChain(t, ControllerConfig{PreemptGrace: 300 * time.Millisecond})
	// 8 GPUs full: one 4-GPU job and two 2-GPU jobs, all preemptible at
	// priority 0, and a 0-GPU job that is not preemptible.
	c.submit("big", 4, 0, true, nil)
	c.submit("small1", 2, 0, true, nil)
	c.submit("small2", 2, 0, true, nil)
	for _, id := range []string{"big", "small1", "small2"} {
		c.running(id)
	}
	// A priority-10 job needs 4 GPUs: stopping "big" alone makes room.
	c.submit("vip", 4, 10, false, nil)
	w, wr := waitKey(t, c.cli, keys.Warning("big"), "big's preemption warning", func(w state.Warning, found bool) bool { return found })
	if w.Reason != state.ReasonPreempted || w.By != "vip" || w.Node != chainNode {
		t.Fatalf("warning %+v", w)
	}
	// The victim stops, is re-queued, and vip runs on its GPUs.
	vip := c.running("vip")
	st := c.status("big", "re-queued", func(st state.Status) bool {
		return st.Phase == state.PhasePending && st.RetryAt == nil && st.Reason != state.ReasonPreempted
	})
	if r, _ := c.cli.Get(context.Background(), keys.Pending("big")); len(r.Kvs) == 0 {
		t.Fatalf("big is not in the queue after its preemption: %+v", st)
	}
	if s, _, _ := state.Get[state.Session](context.Background(), c.cli, keys.Session("big")); s.Eviction != nil || s.Desired != state.DesiredRunning {
		t.Fatalf("big's spec after re-queue: %+v", s)
	}
	// The victim had its grace: vip started only after the warning's stop time.
	if vip.Started == nil || vip.Started.Before(w.StopAt) {
		t.Fatalf("vip started at %v, before the victim's grace ended at %s", vip.Started, w.StopAt)
	}
	_ = wr
	for _, id := range []string{"small1", "small2"} {
		if warned(t, c.cli, id) {
			t.Errorf("%s was warned; one victim was enough", id)
		}
		if st, _, _ := state.Get[state.Status](context.Background(), c.cli, keys.Status(id)); st.Phase != state.PhaseRunning {
			t.Errorf("%s is %s, want still Running", id, st.Phase)
		}
	}
	if got := c.ctl.Stats().Preempted; got != 1 {
		t.Errorf("preempted %d sessions, want 1", got)
	}
	// When vip finishes, the victim runs again.
	c.finish("vip", 0)
	c.running("big")
}

func TestDrainedNodeBatchRunsToCompletion(t *testing.T) {
	c := newChain(t, ControllerConfig{})
	c.submit("job", 2, 0, false, nil)
	c.running("job")
	deadline := time.Now().UTC().Add(200 * time.Millisecond)
	if _, err := state.Put(context.Background(), c.cli, keys.Cordon(chainNode), state.Cordon{Node: chainNode, Since: time.Now().UTC(), Drain: true, Deadline: &deadline}); err != nil {
		t.Fatal(err)
	}
	// Nothing new lands on the drained node.
	c.submit("late", 1, 0, false, nil)
	c.status("late", "told the node is cordoned", func(st state.Status) bool {
		return st.Phase == state.PhasePending && st.Reason != "" && st.Reason != "Queued"
	})
	// The deadline passes; the batch job is neither warned nor stopped, and
	// finishes by itself.
	waitKey(t, c.cli, keys.Status("job"), "a pass after the deadline", func(state.Status, bool) bool {
		return time.Now().After(deadline) && c.ctl.passes() > 0
	})
	passesAfter := c.ctl.passes()
	waitKey(t, c.cli, keys.Status("job"), "two more passes", func(state.Status, bool) bool { return c.ctl.passes() >= passesAfter+2 })
	if warned(t, c.cli, "job") {
		t.Fatal("the batch job on the drained node was warned")
	}
	c.finish("job", 0)
	st := c.status("job", "succeeded", func(st state.Status) bool { return st.Phase.Terminal() })
	if st.Phase != state.PhaseSucceeded {
		t.Fatalf("job ended %s (%s), want Succeeded", st.Phase, st.Message)
	}
	if st, _, _ := state.Get[state.Status](context.Background(), c.cli, keys.Status("late")); st.Phase != state.PhasePending {
		t.Fatalf("a session was bound to the drained node: %+v", st)
	}
}

func TestOnFailureRestartsWithBackoffThenGivesUp(t *testing.T) {
	c := newChain(t, ControllerConfig{})
	c.submit("flaky", 1, 0, false, func(s *state.Session) {
		s.Restart = state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 2, Backoff: state.Duration(100 * time.Millisecond)}
	})
	c.submit("once", 1, 0, false, nil) // policy Never
	seen, reports := c.watchStatus("flaky"), c.watchParts("flaky")
	for i := 0; i <= 2; i++ {
		c.status("flaky", "running", func(st state.Status) bool { return st.Phase == state.PhaseRunning && st.Attempt == i })
		c.finish("flaky", 3)
	}
	st := c.status("flaky", "failed for good", func(st state.Status) bool { return st.Phase.Terminal() })
	if st.Phase != state.PhaseFailed || st.Attempt != 2 || st.ExitCode == nil || *st.ExitCode != 3 {
		t.Fatalf("final status %+v, want Failed with exit code 3 after 2 restarts", st)
	}
	// Each failure but the last waited in BackOff, the delay doubling. The
	// agent fixes retryAt a moment before it stamps its report, so a delay
	// reads up to that moment short (allowed: 90 ms on a loaded machine);
	// the status shows the report's retryAt (the merger stamps the status
	// itself later, by as long as the hop took).
	var delays []time.Duration
	retries := map[time.Time]bool{}
	for _, p := range reports() {
		if p.Reason == state.ReasonBackOff && p.RetryAt != nil && !retries[*p.RetryAt] {
			retries[*p.RetryAt] = true
			delays = append(delays, p.RetryAt.Sub(p.Updated))
		}
	}
	for _, st := range seen() {
		if st.Reason == state.ReasonBackOff && st.RetryAt != nil && !retries[*st.RetryAt] {
			t.Errorf("the status waits until %s, which no report of the agent named", st.RetryAt)
		}
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}
	if len(delays) != len(want) {
		t.Fatalf("back-off delays %v, want 100ms then 200ms", delays)
	}
	for i, d := range delays {
		if d > want[i] || d <= want[i]-90*time.Millisecond {
			t.Fatalf("back-off delays %v, want 100ms then 200ms", delays)
		}
	}
	c.running("once")
	c.finish("once", 3)
	if st := c.status("once", "failed", func(st state.Status) bool { return st.Phase.Terminal() }); st.Phase != state.PhaseFailed || st.Attempt != 0 {
		t.Fatalf("Never: %+v", st)
	}
}
