package lifecycle

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// runController runs a controller with short timings over cli until the
// test ends.
func runController(t testing.TB, cli *clientv3.Client, cfg ControllerConfig) *Controller {
	t.Helper()
	cfg.Keys = keys
	if cfg.Every == 0 {
		cfg.Every = 50 * time.Millisecond
	}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	c := NewController(cli, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controller Run: %v", err)
		}
	})
	return c
}

// running writes session s as bound and running on node since started,
// with activity last seen at lastActive (zero: no activity sampled), the
// way the placer and an agent would leave it.
func running(t testing.TB, cli *clientv3.Client, s state.Session, node string, started, lastActive time.Time) {
	t.Helper()
	ctx := context.Background()
	if s.Owner == "" {
		s.Owner = "ada"
	}
	s.Desired, s.Created = state.DesiredRunning, started.Add(-time.Minute)
	if _, err := state.CreateSession(ctx, cli, keys, s, s.Created); err != nil {
		t.Fatal(err)
	}
	st := state.Status{Session: s.ID, Phase: state.PhaseRunning, Reason: "Started", Nodes: []string{node}, Created: s.Created, Updated: started, Started: &started}
	if !lastActive.IsZero() {
		st.Activity = &state.Activity{LastActive: lastActive, Sampled: lastActive}
	}
	for attempt := 0; ; attempt++ {
		l, rev, err := state.Get[state.Ledger](ctx, cli, keys.Ledger(node))
		if err != nil && !errors.Is(err, state.ErrNotFound) {
			t.Fatal(err)
		}
		if l.Allocations == nil {
			l = state.Ledger{Node: node, Allocations: map[string]state.Allocation{}}
		}
		l.Allocations[s.ID] = state.Allocation{Kind: s.Kind, Owner: s.Owner, Priority: s.Priority, Preemptible: s.Preemptible, Role: state.RoleSingle, CPUMilli: 1000, MemoryMiB: 1024}
		lv, _ := state.Encode(l)
		sv, _ := state.Encode(st)
		r, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(keys.Ledger(node)), "=", rev)).Then(
			clientv3.OpDelete(keys.Pending(s.ID)), clientv3.OpPut(keys.Ledger(node), lv), clientv3.OpPut(keys.Status(s.ID), sv),
		).Commit()
		if err != nil {
			t.Fatal(err)
		}
		if r.Succeeded {
			return
		}
		if attempt > 10 {
			t.Fatal("ledger kept changing")
		}
	}
}

// waitKey waits until cond holds on a value key takes, or fails. It
// watches the key from its first read on, so a value it holds only
// briefly (a status between two writes a fraction of a second apart, on
// a loaded machine) is seen; it also asks cond again every 20 ms of the
// latest value, for conditions that look beyond the key (a controller's
// pass count). The response it returns holds the value cond accepted
// (none when that was the key's absence).
func waitKey[T any](t testing.TB, cli *clientv3.Client, key, what string, cond func(v T, found bool) bool) (T, *clientv3.GetResponse) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	decode := func(kvs []*mvccpb.KeyValue) (T, bool) {
		var v T
		if len(kvs) == 0 {
			return v, false
		}
		v, err := state.Decode[T](kvs[0].Value)
		if err != nil {
			t.Fatal(err)
		}
		return v, true
	}
	v, found := decode(resp.Kvs)
	if cond(v, found) {
		return v, resp
	}
	wch := cli.Watch(ctx, key, clientv3.WithRev(resp.Header.Revision+1))
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				t.Fatalf("timed out waiting for %s (%s = %+v; watch: %v)", what, key, v, wr.Err())
			}
			for _, ev := range wr.Events {
				resp = &clientv3.GetResponse{Header: wr.Header}
				if ev.Type == clientv3.EventTypePut {
					resp.Kvs, resp.Count = []*mvccpb.KeyValue{ev.Kv}, 1
				}
				if v, found = decode(resp.Kvs); cond(v, found) {
					return v, resp
				}
			}
		case <-tick.C:
			if cond(v, found) {
				return v, resp
			}
		}
	}
}

// evicted waits for session id's eviction and checks that a warning of
// the same reason was written before it.
func evicted(t testing.TB, cli *clientv3.Client, id, reason string) state.Eviction {
	t.Helper()
	w, wr := waitKey(t, cli, keys.Warning(id), id+"'s warning", func(w state.Warning, found bool) bool { return found })
	if w.Reason != reason {
		t.Fatalf("%s warned for %s, want %s: %s", id, w.Reason, reason, w.Message)
	}
	s, sr := waitKey(t, cli, keys.Session(id), id+"'s eviction", func(s state.Session, _ bool) bool { return s.Eviction != nil })
	if s.Eviction.Reason != reason {
		t.Fatalf("%s evicted for %s, want %s", id, s.Eviction.Reason, reason)
	}
	if warnRev, evRev := wr.Kvs[0].CreateRevision, sr.Kvs[0].ModRevision; warnRev >= evRev {
		t.Fatalf("%s: warning written at revision %d, eviction at %d: the warning must come first", id, warnRev, evRev)
	}
	if s.Eviction.At.Before(w.StopAt) {
		t.Fatalf("%s evicted at %s, before the warning's stop time %s", id, s.Eviction.At, w.StopAt)
	}
	return *s.Eviction
}

func TestIdleNotebookIsWarnedThenStopped(t *testing.T) {
	cli := etcdtest.Start(t, etcdtest.Options{}).Client(t)
	runController(t, cli, ControllerConfig{IdleTimeout: time.Hour, StopWarning: 500 * time.Millisecond})
	now := time.Now().UTC()
	running(t, cli, state.Session{ID: "idle", Kind: state.KindNotebook}, "n1", now.Add(-3*time.Hour), now.Add(-2*time.Hour))
	running(t, cli, state.Session{ID: "fresh", Kind: state.KindNotebook}, "n1", now.Add(-3*time.Hour), now)
	running(t, cli, state.Session{ID: "short", Kind: state.KindNotebook, Limits: state.Limits{IdleTimeout: state.Duration(time.Minute)}}, "n1", now.Add(-3*time.Hour), now.Add(-2*time.Minute))
	running(t, cli, state.Session{ID: "job", Kind: state.KindBatch}, "n1", now.Add(-3*time.Hour), now.Add(-2*time.Hour))
	running(t, cli, state.Session{ID: "unmeasured", Kind: state.KindNotebook}, "n1", now.Add(-3*time.Hour), time.Time{})

	ev := evicted(t, cli, "idle", state.ReasonIdle)
	if ev.Requeue {
		t.Errorf("an idle session is re-queued: %+v", ev)
	}
	evicted(t, cli, "short", state.ReasonIdle) // its own timeout, shorter than the cluster's
	// Both are stopped; the others, judged in the same passes, never warned.
	for _, id := range []string{"fresh", "job", "unmeasured"} {
		if r, _ := cli.Get(context.Background(), keys.Warning(id)); len(r.Kvs) > 0 {
			t.Errorf("%s was warned: %s", id, r.Kvs[0].Value)
		}
	}
}

func TestIdleWarningWithdrawnWhenUsedAgain(t *testing.T) {
	cli := etcdtest.Start(t, etcdtest.Options{}).Client(t)
	c := runController(t, cli, ControllerConfig{IdleTimeout: time.Hour, StopWarning: time.Hour})
	now := time.Now().UTC()
	running(t, cli, state.Session{ID: "nb", Kind: state.KindNotebook}, "n1", now.Add(-3*time.Hour), now.Add(-2*time.Hour))
	w, _ := waitKey(t, cli, keys.Warning("nb"), "the idle warning", func(w state.Warning, found bool) bool { return found })
	if w.StopAt.Sub(w.Issued) != time.Hour {
		t.Errorf("warning gives %s between issue and stop, want the configured hour", w.StopAt.Sub(w.Issued))
	}
	// The owner comes back: the agent samples new activity.
	st, _, err := state.Get[state.Status](context.Background(), cli, keys.Status("nb"))
	if err != nil {
		t.Fatal(err)
	}
	st.Activity = &state.Activity{LastActive: time.Now().UTC(), Sampled: time.Now().UTC()}
	if _, err := state.Put(context.Background(), cli, keys.Status("nb"), st); err != nil {
		t.Fatal(err)
	}
	waitKey(t, cli, keys.Warning("nb"), "the warning's withdrawal", func(_ state.Warning, found bool) bool { return !found })
	if s, _, _ := state.Get[state.Session](context.Background(), cli, keys.Session("nb")); s.Eviction != nil {
		t.Fatalf("evicted after being used again: %+v", s.Eviction)
	}
	// The controller counts the withdrawal once its delete returns, which
	// may be just after the watch saw it.
	waitFor(t, "the withdrawal counted", func() bool { return c.Stats().Withdrawn >= 1 })
	if got := c.Stats().Withdrawn; got != 1 {
		t.Errorf("withdrawn %d warnings, want 1", got)
	}
}

func TestMaxRuntimeWarnsExtendsAndStops(t *testing.T) {
	cli := etcdtest.Start(t, etcdtest.Options{}).Client(t)
	runController(t, cli, ControllerConfig{StopWarning: time.Minute, MaxRuntime: 8 * time.Hour})
	ctx := context.Background()
	now := time.Now().UTC()
	// Limit 1h, started 59m30s ago: inside the one-minute warning window.
	running(t, cli, state.Session{ID: "job", Kind: state.KindBatch, Limits: state.Limits{MaxRuntime: state.Duration(time.Hour)}}, "n1", now.Add(-59*time.Minute-30*time.Second), time.Time{})
	// The cluster default (8h) applies to a session that names none.
	running(t, cli, state.Session{ID: "dflt", Kind: state.KindBatch}, "n1", now.Add(-8*time.Hour+2*time.Second), time.Time{})
	w, _ := waitKey(t, cli, keys.Warning("job"), "the max runtime warning", func(w state.Warning, found bool) bool { return found })
	if w.Reason != state.ReasonMaxRuntime || w.StopAt.Sub(now.Add(-59*time.Minute-30*time.Second)).Round(time.Second) != time.Hour {
		t.Fatalf("warning %+v, want MaxRuntime stopping one hour after the start", w)
	}
	// The owner extends by an hour (the API writes the spec): the warning goes.
	s, _, _ := state.Get[state.Session](ctx, cli, keys.Session("job"))
	s.Limits.MaxRuntime = state.Duration(2 * time.Hour)
	if _, err := state.Put(ctx, cli, keys.Session("job"), s); err != nil {
		t.Fatal(err)
	}
	waitKey(t, cli, keys.Warning("job"), "the warning's withdrawal after the extension", func(_ state.Warning, found bool) bool { return !found })
	ev := evicted(t, cli, "dflt", state.ReasonMaxRuntime)
	if ev.Message != "stopped at its max runtime of 8h0m0s" {
		t.Errorf("eviction message %q", ev.Message)
	}
	if s, _, _ := state.Get[state.Session](ctx, cli, keys.Session("job")); s.Eviction != nil {
		t.Fatalf("the extended session was evicted: %+v", s.Eviction)
	}
}

func TestDrainStopsNotebooksAtTheDeadlineOnly(t *testing.T) {
	cli := etcdtest.Start(t, etcdtest.Options{}).Client(t)
	runController(t, cli, ControllerConfig{IdleTimeout: 0})
	ctx := context.Background()
	now := time.Now().UTC()
	running(t, cli, state.Session{ID: "nb", Kind: state.KindNotebook}, "n1", now.Add(-time.Hour), now)
	running(t, cli, state.Session{ID: "job", Kind: state.KindBatch}, "n1", now.Add(-time.Hour), now)
	running(t, cli, state.Session{ID: "other", Kind: state.KindNotebook}, "n2", now.Add(-time.Hour), now)
	running(t, cli, state.Session{ID: "later", Kind: state.KindNotebook}, "n3", now.Add(-time.Hour), now)
	deadline := time.Now().UTC().Add(time.Second)
	if _, err := state.Put(ctx, cli, keys.Cordon("n1"), state.Cordon{Node: "n1", Reason: "fan replacement", Since: now, Drain: true, Deadline: &deadline}); err != nil {
		t.Fatal(err)
	}
	far := now.Add(time.Hour)
	if _, err := state.Put(ctx, cli, keys.Cordon("n3"), state.Cordon{Node: "n3", Since: now, Drain: true, Deadline: &far}); err != nil {
		t.Fatal(err)
	}
	ev := evicted(t, cli, "nb", state.ReasonDrained)
	if ev.Message != "stopped because node n1 is drained" {
		t.Errorf("eviction message %q", ev.Message)
	}
	// The notebook on n3 is warned; uncordoning n3 withdraws it.
	waitKey(t, cli, keys.Warning("later"), "n3's drain warning", func(w state.Warning, found bool) bool { return found && w.Node == "n3" })
	if _, err := cli.Delete(ctx, keys.Cordon("n3")); err != nil {
		t.Fatal(err)
	}
	waitKey(t, cli, keys.Warning("later"), "the withdrawal after uncordon", func(_ state.Warning, found bool) bool { return !found })
	for _, id := range []string{"job", "other"} {
		if r, _ := cli.Get(ctx, keys.Warning(id)); len(r.Kvs) > 0 {
			t.Errorf("%s was warned: %s", id, r.Kvs[0].Value)
		}
		if s, _, _ := state.Get[state.Session](ctx, cli, keys.Session(id)); s.Eviction != nil {
			t.Errorf("%s was evicted: %+v", id, s.Eviction)
		}
	}
}

func TestWaitingSessionIsRequeuedAtRetryTime(t *testing.T) {
	cli := etcdtest.Start(t, etcdtest.Options{}).Client(t)
	c := runController(t, cli, ControllerConfig{})
	ctx := context.Background()
	now := time.Now().UTC()
	s := state.Session{ID: "job", Owner: "ada", Kind: state.KindBatch, Desired: state.DesiredRunning, Created: now,
		Restart: state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 3}}
	if _, err := state.CreateSession(ctx, cli, keys, s, now); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, keys.Pending("job")); err != nil { // as if bound, ran and released
		t.Fatal(err)
	}
	retry := time.Now().UTC().Add(300 * time.Millisecond)
	code := 1
	st := state.Status{Session: "job", Phase: state.PhasePending, Reason: state.ReasonBackOff, Message: "exited with code 1", ExitCode: &code, Created: now, Updated: now, RetryAt: &retry}
	if _, err := state.Put(ctx, cli, keys.Status("job"), st); err != nil {
		t.Fatal(err)
	}
	e, _ := waitKey(t, cli, keys.Pending("job"), "the queue entry", func(_ state.QueueEntry, found bool) bool { return found })
	if e.Attempt != 1 || !e.Created.Equal(now) {
		t.Errorf("queue entry %+v: want attempt 1 and the first submission's time", e)
	}
	got, _, _ := state.Get[state.Status](ctx, cli, keys.Status("job"))
	if got.Phase != state.PhasePending || got.Attempt != 1 || got.RetryAt != nil || time.Now().Before(retry) {
		t.Errorf("status after re-queue %+v", got)
	}
	// The counter is bumped after the re-queue's commit, which the test
	// may see first.
	waitFor(t, "the re-queue counted", func() bool { return c.Stats().Requeued >= 1 })
	if n := c.Stats().Requeued; n != 1 {
		t.Errorf("requeued %d, want 1", n)
	}
	// A stop while waiting ends it at once: no agent and no queue entry hold it.
	if _, err := cli.Delete(ctx, keys.Pending("job")); err != nil {
		t.Fatal(err)
	}
	got.Phase, got.Reason = state.PhasePending, state.ReasonBackOff
	far := time.Now().Add(time.Hour)
	got.RetryAt = &far
	if _, err := state.Put(ctx, cli, keys.Status("job"), got); err != nil {
		t.Fatal(err)
	}
	out, err := state.StopSession(ctx, cli, keys, "job", "ada", time.Now())
	if err != nil || out != state.StopCancelled {
		t.Fatalf("stop while waiting: %v %v, want cancelled", out, err)
	}
	if st, _, _ := state.Get[state.Status](ctx, cli, keys.Status("job")); st.Phase != state.PhaseStopped {
		t.Fatalf("status after stop while waiting: %+v", st)
	}
}

// TestWaitingSessionStoppedByItsOwnerEnds is issue 11's item 5 from the
// controller's side: a session left waiting (Pending, BackOff, retryAt)
// with desired=stopped — its owner's stop landed while its agent released
// it — was skipped by every pass: never re-queued, never ended, never
// retired. The controller ends it Stopped.
func TestWaitingSessionStoppedByItsOwnerEnds(t *testing.T) {
	cli := etcdtest.Start(t, etcdtest.Options{}).Client(t)
	runController(t, cli, ControllerConfig{})
	ctx := context.Background()
	now := time.Now().UTC()
	s := state.Session{ID: "job", Owner: "ada", Kind: state.KindBatch, Desired: state.DesiredStopped, Created: now,
		Restart: state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 3}}
	if _, err := state.Put(ctx, cli, keys.Session("job"), s); err != nil {
		t.Fatal(err)
	}
	code := 1
	st := state.Status{Session: "job", Phase: state.PhasePending, Reason: state.ReasonBackOff, ExitCode: &code, Created: now, Updated: now, RetryAt: &now}
	if _, err := state.Put(ctx, cli, keys.Status("job"), st); err != nil {
		t.Fatal(err)
	}
	got, _ := waitKey(t, cli, keys.Status("job"), "the session to end", func(st state.Status, found bool) bool { return found && st.Phase.Terminal() })
	if got.Phase != state.PhaseStopped || got.Finished == nil || got.RetryAt != nil {
		t.Errorf("status %+v: want Stopped, finished", got)
	}
	if r, err := cli.Get(ctx, keys.Pending("job")); err != nil || len(r.Kvs) > 0 {
		t.Errorf("a stopped session was re-queued (err %v)", err)
	}
}

// TestMaxRuntimeCountsFromBind is point 5 of issue 33: max runtime counts
// from the bind, so a session whose start never completes (Starting, no
// start time) is warned and evicted when its limit since the bind has
// passed, and one running counts from its bind too, not its later start.
// Before, both counted from a start time, never set for the first.
func TestMaxRuntimeCountsFromBind(t *testing.T) {
	cli := etcdtest.Start(t, etcdtest.Options{}).Client(t)
	runController(t, cli, ControllerConfig{StopWarning: time.Minute})
	ctx := context.Background()
	now := time.Now().UTC()
	bound := now.Add(-time.Hour - time.Minute)
	limit := state.Limits{MaxRuntime: state.Duration(time.Hour)}
	// Running, bound 61 minutes ago, started only a minute ago.
	running(t, cli, state.Session{ID: "late", Kind: state.KindBatch, Limits: limit}, "n1", now.Add(-time.Minute), time.Time{})
	// Starting since its bind 61 minutes ago: its image never came.
	running(t, cli, state.Session{ID: "stuck", Kind: state.KindNotebook, Limits: limit}, "n1", now, time.Time{})
	for _, id := range []string{"late", "stuck"} {
		st, _, err := state.Get[state.Status](ctx, cli, keys.Status(id))
		if err != nil {
			t.Fatal(err)
		}
		st.Bound = &bound
		if id == "stuck" {
			st.Phase, st.Reason, st.Started = state.PhaseStarting, "Pulling", nil
		}
		if _, err := state.Put(ctx, cli, keys.Status(id), st); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"late", "stuck"} {
		if ev := evicted(t, cli, id, state.ReasonMaxRuntime); ev.Message != "stopped at its max runtime of 1h0m0s" {
			t.Errorf("%s: eviction message %q", id, ev.Message)
		}
	}
}
