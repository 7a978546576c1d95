package merger_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/merger"
	"github.com/voyager-gpu/voyager/state"
)

var keys = state.MustKeys("/sk")

// run starts n mergers side by side until the test ends.
func run(t *testing.T, cli *clientv3.Client, n int) []*merger.Merger {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var ms []*merger.Merger
	done := make(chan error, n)
	for range n {
		m := merger.New(cli, merger.Config{Keys: keys, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Resync: 200 * time.Millisecond})
		ms = append(ms, m)
		go func() { done <- m.Run(ctx) }()
	}
	t.Cleanup(func() {
		cancel()
		for range n {
			if err := <-done; err != nil {
				t.Errorf("merger Run: %v", err)
			}
		}
	})
	return ms
}

// bound creates session s and binds it to nodes the way a placer does,
// and returns each binding's create revision by node.
func bound(t testing.TB, cli *clientv3.Client, s state.Session, nodes ...string) map[string]state.Binding {
	t.Helper()
	ctx := context.Background()
	now := time.Now().UTC()
	s.Created, s.Desired = now, state.DesiredRunning
	if _, err := state.CreateSession(ctx, cli, keys, s, now); err != nil {
		t.Fatal(err)
	}
	pr, err := cli.Get(ctx, keys.Pending(s.ID))
	if err != nil || len(pr.Kvs) == 0 {
		t.Fatalf("read pending: %v", err)
	}
	qrev := pr.Kvs[0].ModRevision
	var bs []state.Binding
	for i, n := range nodes {
		role := state.RoleSingle
		if len(nodes) > 1 {
			role = state.RoleWorker
			if i == 0 {
				role = state.RoleHead
			}
		}
		bs = append(bs, state.Binding{Session: s.ID, Node: n, Role: role, Worker: i, QueueRevision: qrev, Bound: now})
	}
	cmps, ops, err := state.BindOps(keys, nil, []state.Placement{{Session: s.ID, PendingRevision: qrev, Bindings: bs,
		Status: state.Status{Session: s.ID, Phase: state.PhaseBound, Nodes: nodes, Created: now, Updated: now, Bound: &now}}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil || !r.Succeeded {
		t.Fatalf("bind: %v", err)
	}
	out := map[string]state.Binding{}
	for _, b := range bs {
		out[b.Node] = b
	}
	return out
}

// report writes the part of b (created in the bind) as its agent does.
func report(t testing.TB, cli *clientv3.Client, b state.Binding, mod func(*state.PartStatus)) {
	t.Helper()
	ctx := context.Background()
	r, err := cli.Get(ctx, keys.Binding(b.Node, b.Session))
	if err != nil || len(r.Kvs) == 0 {
		t.Fatalf("read binding: %v", err)
	}
	p := state.NewPartStatus(b, r.Kvs[0].CreateRevision)
	p.Updated = time.Now().UTC()
	mod(&p)
	ops, err := state.PartOps(keys, p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		t.Fatal(err)
	}
}

// release reports the part's end and deletes its binding in one
// transaction, as state.Release does.
func release(t testing.TB, cli *clientv3.Client, b state.Binding, ph state.Phase, code int) {
	t.Helper()
	err := state.Release(context.Background(), cli, keys, b.Node, b.Session, bindingRev(t, cli, b),
		func(_ state.Session, p state.PartStatus) (state.Event, state.PartStatus, error) {
			now := time.Now().UTC()
			p.ExitCode, p.Finished, p.Updated, p.Reason, p.Message = &code, &now, now, "Exited", "exited"
			ev, err := state.EventOf(ph, "Exited")
			return ev, p, err
		})
	if err != nil {
		t.Fatal(err)
	}
}

func bindingRev(t testing.TB, cli *clientv3.Client, b state.Binding) int64 {
	t.Helper()
	r, err := cli.Get(context.Background(), keys.Binding(b.Node, b.Session))
	if err != nil || len(r.Kvs) == 0 {
		t.Fatalf("read binding: %v", err)
	}
	return r.Kvs[0].CreateRevision
}

func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, got := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; last: %s", what, got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitPhase(t *testing.T, cli *clientv3.Client, id string, want state.Phase) state.Status {
	t.Helper()
	var st state.Status
	waitFor(t, id+" "+string(want), func() (bool, string) {
		var err error
		st, _, err = state.Get[state.Status](context.Background(), cli, keys.Status(id))
		return err == nil && st.Phase == want, string(st.Phase)
	})
	return st
}

func partGone(t *testing.T, cli *clientv3.Client, node, id string) {
	t.Helper()
	waitFor(t, "part of "+id+" on "+node+" deleted", func() (bool, string) {
		_, _, err := state.Get[state.PartStatus](context.Background(), cli, keys.Part(node, id))
		return errors.Is(err, state.ErrNotFound), ""
	})
}

// TestMergerFollowsASession: two mergers side by side turn one part's
// reports into the session's status, move by move, and delete the part
// once its end is in the status. The secrets of a URL never reach it.
func TestMergerFollowsASession(t *testing.T) {
	cli := etcdtest.New(t)
	ms := run(t, cli, 2)
	b := bound(t, cli, state.Session{ID: "sk1", Owner: "ada", Kind: state.KindBatch}, "n1")["n1"]
	report(t, cli, b, func(p *state.PartStatus) { p.Phase, p.Reason = state.PhaseStarting, "Pulling" })
	waitPhase(t, cli, "sk1", state.PhaseStarting)
	report(t, cli, b, func(p *state.PartStatus) {
		now := time.Now().UTC()
		p.Phase, p.Started, p.URLs = state.PhaseRunning, &now, map[string]string{"logs": "https://n1/logs?key=sekrit"}
	})
	st := waitPhase(t, cli, "sk1", state.PhaseRunning)
	if st.Started == nil || st.URLs["logs"] != "https://n1/logs" {
		t.Errorf("running status = %+v, want the part's start and its log URL without the key", st)
	}
	release(t, cli, b, state.PhaseFailed, 3)
	st = waitPhase(t, cli, "sk1", state.PhaseFailed)
	if st.ExitCode == nil || *st.ExitCode != 3 || st.Finished == nil {
		t.Errorf("final status = %+v, want exit 3, finished", st)
	}
	partGone(t, cli, "n1", "sk1")
	// A merger counts a write once its transaction returns, which may be
	// just after the part's deletion was seen.
	waitFor(t, "the three moves counted", func() (bool, string) {
		n := ms[0].Writes() + ms[1].Writes()
		return n >= 3, fmt.Sprint(n)
	})
	if ms[0].Writes()+ms[1].Writes() < 3 {
		t.Errorf("mergers wrote %d times, want at least the three moves", ms[0].Writes()+ms[1].Writes())
	}
}

// TestMergerEndsAGangOnAFailedPart: a multi-node job fails when one part
// fails (StopAll), with that part's exit code; the parts still running
// are left to their agents, and deleted once they report their end.
func TestMergerEndsAGangOnAFailedPart(t *testing.T) {
	cli := etcdtest.New(t)
	run(t, cli, 2)
	bs := bound(t, cli, state.Session{ID: "sk2", Owner: "ada", Kind: state.KindBatch, Nodes: 3}, "n1", "n2", "n3")
	for _, n := range []string{"n1", "n2", "n3"} {
		report(t, cli, bs[n], func(p *state.PartStatus) {
			now := time.Now().UTC()
			p.Phase, p.Started = state.PhaseRunning, &now
		})
		if n == "n2" {
			st, _, err := state.Get[state.Status](context.Background(), cli, keys.Status("sk2"))
			if err == nil && st.Phase == state.PhaseRunning {
				t.Errorf("the job is Running with 2 of 3 parts running")
			}
		}
	}
	waitPhase(t, cli, "sk2", state.PhaseRunning)
	release(t, cli, bs["n3"], state.PhaseFailed, 7)
	st := waitPhase(t, cli, "sk2", state.PhaseFailed)
	if st.ExitCode == nil || *st.ExitCode != 7 {
		t.Errorf("exit code = %v, want the failed part's 7", st.ExitCode)
	}
	partGone(t, cli, "n3", "sk2")
	if _, _, err := state.Get[state.PartStatus](context.Background(), cli, keys.Part("n1", "sk2")); err != nil {
		t.Errorf("a running part of the ended job was deleted before its agent stopped it: %v", err)
	}
	release(t, cli, bs["n1"], state.PhaseStopped, 143)
	partGone(t, cli, "n1", "sk2")
	if st, _, _ := state.Get[state.Status](context.Background(), cli, keys.Status("sk2")); st.Phase != state.PhaseFailed || *st.ExitCode != 7 {
		t.Errorf("a later part's end changed the ended job: %s exit %v", st.Phase, st.ExitCode)
	}
}

// TestMergerDeletesStaleParts: parts of a session whose status is gone,
// and parts of another queueing, are deleted without touching the status.
func TestMergerDeletesStaleParts(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	b := bound(t, cli, state.Session{ID: "sk3", Owner: "ada", Kind: state.KindBatch}, "n1")["n1"]
	old := b
	old.QueueRevision--
	report(t, cli, old, func(p *state.PartStatus) { p.Phase = state.PhaseRunning })
	orphan := state.PartStatus{Session: "sk4", Node: "n1", Phase: state.PhaseRunning, QueueRevision: 1}
	ops, err := state.PartOps(keys, orphan)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		t.Fatal(err)
	}
	before, _, err := state.Get[state.Status](ctx, cli, keys.Status("sk3"))
	if err != nil {
		t.Fatal(err)
	}
	run(t, cli, 1)
	partGone(t, cli, "n1", "sk3")
	partGone(t, cli, "n1", "sk4")
	if st, _, _ := state.Get[state.Status](ctx, cli, keys.Status("sk3")); st.Phase != before.Phase {
		t.Errorf("a stale part moved the status: %s → %s", before.Phase, st.Phase)
	}
}

// TestMergerSettlesAQuickSuccession: a part launched, running and ended
// within the settle time (Config.Settle) is merged once: the status goes
// from Bound to its end in one write, with the exit code and the start
// the parts reported, and the part is deleted with it.
func TestMergerSettlesAQuickSuccession(t *testing.T) {
	cli := etcdtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	m := merger.New(cli, merger.Config{Keys: keys, Settle: 3 * time.Second, Resync: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("merger Run: %v", err)
		}
	})
	b := bound(t, cli, state.Session{ID: "sk9", Owner: "ada", Kind: state.KindBatch}, "n1")["n1"]
	began := time.Now()
	report(t, cli, b, func(p *state.PartStatus) { p.Phase, p.Reason = state.PhaseStarting, "Launching" })
	// The reports spread over half a second, as a short job's do: a
	// merger without a settle time writes Starting meanwhile.
	time.Sleep(500 * time.Millisecond)
	started := time.Now().UTC()
	report(t, cli, b, func(p *state.PartStatus) { p.Phase, p.Started = state.PhaseRunning, &started })
	release(t, cli, b, state.PhaseSucceeded, 0)
	wrote := time.Since(began) // the reports, all within the settle time
	st := waitPhase(t, cli, "sk9", state.PhaseSucceeded)
	partGone(t, cli, "n1", "sk9")
	if st.ExitCode == nil || *st.ExitCode != 0 || st.Started == nil || !st.Started.Equal(started) || st.Finished == nil {
		t.Errorf("final status = %+v, want exit 0, the part's start, finished", st)
	}
	r, err := cli.Get(context.Background(), keys.Status("sk9"))
	if err != nil || len(r.Kvs) == 0 {
		t.Fatalf("read status: %v", err)
	}
	// Created (Pending), bound, and the merger's one write.
	if v := r.Kvs[0].Version; v != 3 {
		t.Errorf("the status was written %d times, want 3 (created, bound, merged once; the reports took %s)", v, wrote)
	}
	if w := m.Writes(); w != 1 {
		t.Errorf("the merger wrote %d times, want 1", w)
	}
}

// TestMergerWithdrawsTheWarningOfAnEndedAttempt: a session warned that it
// will be stopped (a lifecycle warning) loses the warning in the very
// transaction that writes its end, not in a transaction of its own; a
// running session's warning stays.
func TestMergerWithdrawsTheWarningOfAnEndedAttempt(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	run(t, cli, 1)
	b := bound(t, cli, state.Session{ID: "skw", Owner: "ada", Kind: state.KindBatch}, "n1")["n1"]
	now := time.Now().UTC()
	w := state.Warning{Session: "skw", Reason: state.ReasonMaxRuntime, Message: "max runtime", Issued: now, StopAt: now.Add(time.Minute)}
	if _, err := state.Put(ctx, cli, keys.Warning("skw"), w); err != nil {
		t.Fatal(err)
	}
	report(t, cli, b, func(p *state.PartStatus) { p.Phase, p.Started = state.PhaseRunning, &now })
	waitPhase(t, cli, "skw", state.PhaseRunning)
	if r, err := cli.Get(ctx, keys.Warning("skw")); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("the running session's warning went: %v", err)
	}
	release(t, cli, b, state.PhaseSucceeded, 0)
	waitPhase(t, cli, "skw", state.PhaseSucceeded)
	r, err := cli.Get(ctx, keys.Warning("skw"))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) != 0 {
		t.Fatalf("the ended session's warning stays: %s", r.Kvs[0].Value)
	}
	// Deleted by the status's own write: the warning's history ends at
	// the revision that wrote the end.
	sr, err := cli.Get(ctx, keys.Status("skw"))
	if err != nil || len(sr.Kvs) == 0 {
		t.Fatalf("read status: %v", err)
	}
	h, err := cli.Get(ctx, keys.Warning("skw"), clientv3.WithRev(sr.Kvs[0].ModRevision-1))
	if err != nil || len(h.Kvs) != 1 {
		t.Errorf("the warning was gone before the end was written (%v): deleted by another transaction", err)
	}
}
