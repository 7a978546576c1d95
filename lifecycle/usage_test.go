package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/internal/testlog"
	"github.com/voyager-gpu/voyager/state"
)

// runAccountant runs an accountant over cli until stop is called or the
// test ends.
// It gathers ended attempts for 20 ms (AccountantConfig.Gather), so that
// the tests' waits stay short; TestAccountantGathersEnds checks the
// gathering itself.
func runAccountant(t testing.TB, cli *clientv3.Client) (*Accountant, func()) {
	t.Helper()
	return runAccountantWith(t, cli, AccountantConfig{Keys: keys, CursorEvery: 50 * time.Millisecond, Gather: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
}

func runAccountantWith(t testing.TB, cli *clientv3.Client, cfg AccountantConfig) (*Accountant, func()) {
	t.Helper()
	a := NewAccountant(cli, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("accountant Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return a, stop
}

// usageDriver writes sessions and their statuses as the API, the placer
// and the merger would, with the times it is told.
type usageDriver struct {
	t   *testing.T
	cli *clientv3.Client
}

func (d usageDriver) create(id, owner, team string, gpus int, at time.Time) {
	d.t.Helper()
	s := state.Session{ID: id, Owner: owner, Team: team, Kind: state.KindBatch, Resources: state.Resources{GPUs: gpus, CPUMilli: 1000, MemoryMiB: 1024},
		Desired: state.DesiredRunning, Created: at}
	if _, err := state.CreateSession(context.Background(), d.cli, keys, s, at); err != nil {
		d.t.Fatal(err)
	}
}

func (d usageDriver) status(st state.Status) {
	d.t.Helper()
	if _, err := state.Put(context.Background(), d.cli, keys.Status(st.Session), st); err != nil {
		d.t.Fatal(err)
	}
}

// run binds attempt (queue revision qr) of id at bound and runs it.
func (d usageDriver) run(id string, attempt int, qr int64, bound time.Time) state.Status {
	d.t.Helper()
	st := state.Status{Session: id, Phase: state.PhaseBound, Attempt: attempt, QueueRevision: qr, Bound: &bound, Updated: bound}
	d.status(st)
	started := bound.Add(time.Second)
	st.Phase, st.Started, st.Updated = state.PhaseRunning, &started, started
	d.status(st)
	return st
}

func (d usageDriver) finish(st state.Status, at time.Time) {
	d.t.Helper()
	st.Phase, st.Finished, st.Updated = state.PhaseSucceeded, &at, at
	d.status(st)
}

// hourLong creates sessions s-<from> to s-<to-1> (three digits) of ada,
// each one attempt (queue revision 10+i) bound at day and ended an hour
// later.
func (d usageDriver) hourLong(from, to int, day time.Time) {
	d.t.Helper()
	for i := from; i < to; i++ {
		id := fmt.Sprintf("s-%03d", i)
		d.create(id, "ada", "", 1, day)
		d.finish(d.run(id, 0, int64(10+i), day), day.Add(time.Hour))
	}
}

func (d usageDriver) day(day string) state.UsageDay {
	d.t.Helper()
	v, _, err := state.Get[state.UsageDay](context.Background(), d.cli, keys.GPUHoursDir()+day)
	if err != nil {
		return state.UsageDay{}
	}
	return v
}

func (d usageDriver) accruals() map[string]state.Accrual {
	d.t.Helper()
	resp, err := d.cli.Get(context.Background(), keys.Accruals(), clientv3.WithPrefix())
	if err != nil {
		d.t.Fatal(err)
	}
	out := map[string]state.Accrual{}
	for _, kv := range resp.Kvs {
		a, err := state.Decode[state.Accrual](kv.Value)
		if err != nil {
			d.t.Fatal(err)
		}
		out[string(kv.Key)] = a
	}
	return out
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, with a deadline
	}
}

// TestAccountantCountsEachAttemptOnce: ended attempts become accruals
// and daily GPU-time, split at UTC midnight, by team and owner: a run to
// its end, a back-off and its restart (two attempts), a lost node's
// re-queue (the placer's fresh status keeps no bound time: the previous
// value has it); attempts that end while no accountant runs are counted
// when one starts again from its cursor; a second accountant, a restart
// and a replay from no cursor at all count nothing twice; a session
// retired before it was counted is reported late, not counted.
func TestAccountantCountsEachAttemptOnce(t *testing.T) {
	cli := etcdtest.New(t)
	d := usageDriver{t: t, cli: cli}
	acc, stop := runAccountant(t, cli)
	// Following changes before any is made: without a cursor it first
	// counts from the statuses as listed, and a listing after s-cyd's
	// re-queue would show no trace of its first attempt (its back-off
	// status, which held the bound time, overwritten).
	waitUntil(t, "the accountant to lead", func() bool { return acc.Applied() > 0 })
	day := time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	h := func(x float64) time.Duration { return time.Duration(x * float64(time.Hour)) }

	// ada, vision, 2 GPUs, 90 minutes on the 20th.
	d.create("s-ada", "ada", "vision", 2, day.Add(h(9)))
	d.finish(d.run("s-ada", 0, 10, day.Add(h(9))), day.Add(h(10.5)))
	// bob, no team, 1 GPU, 23:00 to 01:30 the next day.
	d.create("s-bob", "bob", "", 1, day.Add(h(23)))
	d.finish(d.run("s-bob", 0, 20, day.Add(h(23))), day.Add(h(25.5)))
	// cyd, vision, 4 GPUs: 1 h, backs off, re-queued, 2 h more.
	d.create("s-cyd", "cyd", "vision", 4, day.Add(h(12)))
	st := d.run("s-cyd", 0, 30, day.Add(h(12)))
	retry := day.Add(h(13.5))
	st.Phase, st.Reason, st.RetryAt, st.Updated = state.PhasePending, state.ReasonBackOff, &retry, day.Add(h(13))
	d.status(st)
	d.status(state.Status{Session: "s-cyd", Phase: state.PhasePending, Reason: "Queued", Attempt: 1, Updated: retry})
	d.finish(d.run("s-cyd", 1, 40, day.Add(h(14))), day.Add(h(16)))
	waitUntil(t, "four accruals", func() bool { return len(d.accruals()) == 4 })

	want := map[string]map[string]int64{
		"2026-11-20": {"vision/ada": 2 * 90 * 60000, "/bob": 60 * 60000, "vision/cyd": 4*60*60000 + 4*120*60000},
		"2026-11-21": {"/bob": 90 * 60000},
	}
	check := func(when string) {
		t.Helper()
		for dayName, subjects := range want {
			got := d.day(dayName).GPUMilliseconds
			if len(got) != len(subjects) {
				t.Errorf("%s: day %s holds %v, want %v", when, dayName, got, subjects)
			}
			for s, ms := range subjects {
				if got[s] != ms {
					t.Errorf("%s: day %s %s = %d ms, want %d", when, dayName, s, got[s], ms)
				}
			}
		}
	}
	check("first pass")
	reg := prometheus.NewRegistry()
	reg.MustRegister(acc.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "voyager_usage_attempts_accrued_total" && mf.GetMetric()[0].GetCounter().GetValue() != 4 {
			t.Errorf("voyager_usage_attempts_accrued_total %v, want 4", mf.GetMetric()[0].GetCounter().GetValue())
		}
		if mf.GetName() == "voyager_usage_applied_revision" && mf.GetMetric()[0].GetGauge().GetValue() <= 0 {
			t.Errorf("voyager_usage_applied_revision %v, want the revision handled", mf.GetMetric()[0].GetGauge().GetValue())
		}
	}
	if len(mfs) != 5 {
		t.Errorf("%d usage metrics, want 5", len(mfs))
	}
	if a := d.accruals()[keys.Accrual("s-cyd", 30)]; a.GPUs != 4 || a.Team != "vision" || !a.Ended.Equal(day.Add(h(13))) || a.GPUMilliseconds != 4*3600000 {
		t.Errorf("cyd's first attempt: %+v", a)
	}

	// A lost node while no accountant runs: dan's attempt ends and he is
	// re-queued by the placer's fresh status.
	stop()
	d.create("s-dan", "dan", "vision", 1, day.Add(h(18)))
	d.run("s-dan", 0, 50, day.Add(h(18)))
	d.status(state.Status{Session: "s-dan", Phase: state.PhasePending, Reason: "NodeLost", Attempt: 1, Updated: day.Add(h(19))})
	want["2026-11-20"]["vision/dan"] = 60 * 60000

	// Two accountants at once, then one more from no cursor at all.
	a2, stop2 := runAccountant(t, cli)
	a3, stop3 := runAccountant(t, cli)
	// Counted by the one that leads (and answered before it is stopped).
	waitUntil(t, "dan's accrual", func() bool { return len(d.accruals()) == 5 && a2.Accrued()+a3.Accrued() == 1 })
	stop2()
	stop3()
	if _, err := cli.Delete(context.Background(), keys.UsageCursor()); err != nil {
		t.Fatal(err)
	}
	a4, stop4 := runAccountant(t, cli)
	waitUntil(t, "the replay to catch up", func() bool { rev := a4.Applied(); return rev > 0 })
	stop4()
	check("after a second accountant and a replay")
	if n := acc.Accrued() + a2.Accrued() + a3.Accrued() + a4.Accrued(); n != 5 {
		t.Errorf("accountants recorded %d attempts, want 5", n)
	}

	// Retired before it was counted: late, not counted.
	d.create("s-eve", "eve", "vision", 8, day.Add(h(20)))
	d.finish(d.run("s-eve", 0, 60, day.Add(h(20))), day.Add(h(21)))
	if _, err := cli.Delete(context.Background(), keys.Status("s-eve")); err != nil {
		t.Fatal(err)
	}
	a5, _ := runAccountant(t, cli)
	waitUntil(t, "eve reported late", func() bool { return a5.Late() == 1 })
	check("after a retired session")

	// Retention takes ada's session: its mark goes, her GPU-time stays.
	if _, err := cli.Delete(context.Background(), keys.Status("s-ada")); err != nil {
		t.Fatal(err)
	}
	if n, err := a5.SweepMarks(context.Background()); err != nil || n != 1 {
		t.Fatalf("sweep: %d, %v; want ada's marks deleted", n, err)
	}
	if _, ok := d.accruals()[keys.Accrual("s-ada", 10)]; ok || len(d.accruals()) != 4 {
		t.Errorf("accruals after the sweep: %d, ada's still there: %v", len(d.accruals()), ok)
	}
	check("after the sweep")
}

// TestAccountantGathersEnds: attempts that end within the gathering
// window, each in a status change of its own and 50 ms apart, are
// recorded in one transaction (their accruals share a revision, and the
// day record was written once); the cursor then moves past them. With
// Gather off, each watch response was a transaction of its own (five
// revisions here, one a bind in the soak).
func TestAccountantGathersEnds(t *testing.T) {
	cli := etcdtest.New(t)
	d := usageDriver{t: t, cli: cli}
	acc, _ := runAccountantWith(t, cli, AccountantConfig{Keys: keys, CursorEvery: 50 * time.Millisecond, Gather: 3 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	waitUntil(t, "the accountant to lead", func() bool { return acc.Applied() > 0 })
	day := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	var last int64
	for i := range 5 {
		id := fmt.Sprintf("s-%d", i)
		d.create(id, "ada", "", 1, day)
		st := d.run(id, 0, int64(10+i), day)
		st.Phase, st.Finished, st.Updated = state.PhaseSucceeded, ptr(day.Add(time.Hour)), day.Add(time.Hour)
		r, err := state.Put(context.Background(), cli, keys.Status(id), st)
		if err != nil {
			t.Fatal(err)
		}
		last = r
		time.Sleep(50 * time.Millisecond) // the ends apart: separate watch responses
	}
	waitUntil(t, "five accruals", func() bool { return len(d.accruals()) == 5 })
	resp, err := cli.Get(context.Background(), keys.Accruals(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	revs := map[int64]bool{}
	for _, kv := range resp.Kvs {
		revs[kv.ModRevision] = true
	}
	if len(revs) != 1 {
		t.Errorf("the five accruals were written in %d transactions, want 1", len(revs))
	}
	dr, err := cli.Get(context.Background(), keys.GPUHoursDir()+"2026-11-20")
	if err != nil || len(dr.Kvs) != 1 {
		t.Fatalf("day record: %v, %v", dr, err)
	}
	if dr.Kvs[0].Version != 1 {
		t.Errorf("the day record was written %d times, want once", dr.Kvs[0].Version)
	}
	if got := d.day("2026-11-20"); got.Attempts != 5 || got.GPUMilliseconds["/ada"] != 5*3600000 {
		t.Errorf("day: %+v, want 5 attempts of an hour", got)
	}
	waitUntil(t, "the accountant past the ends", func() bool { return acc.Applied() >= last })
}

func ptr[T any](v T) *T { return &v }

// TestAccountantRecordsWhatItGatheredWhenStopped: an accountant stopped
// while it gathers ends (an orderly stop: its context ends) records them
// before it returns, rather than leaving them to the next accountant.
// An accountant that loses its leadership while it gathers records what
// it gathered, and one that leads again without a cursor records the
// ends from the statuses (catchUp) without gathering them: either leaves
// nothing gathered to stop with, so such a round is tried again, with
// new sessions, up to three times (TestAccountantStopsInOrderEveryTime
// failed in CI once on a round that never gathered its end).
func TestAccountantRecordsWhatItGatheredWhenStopped(t *testing.T) {
	cli := etcdtest.New(t)
	d := usageDriver{t: t, cli: cli}
	acc, stop := runAccountantWith(t, cli, AccountantConfig{Keys: keys, CursorEvery: time.Hour, Gather: time.Hour,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	waitUntil(t, "the accountant to lead", func() bool { return acc.Applied() > 0 })
	day := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	// recorded counts the accruals of the round's sessions.
	recorded := func(round int) int {
		n := 0
		for k := range d.accruals() {
			if strings.Contains(k, fmt.Sprintf("/s-stop-%d-", round)) {
				n++
			}
		}
		return n
	}
	const tries = 3
	round := 0
	for ; ; round++ {
		for i := range 3 {
			id := fmt.Sprintf("s-stop-%d-%d", round, i)
			d.create(id, "ada", "", 1, day)
			d.finish(d.run(id, 0, int64(10+i), day), day.Add(time.Hour))
		}
		waitUntil(t, "three ends gathered, or recorded", func() bool { return acc.gathered.Load() == 3 || recorded(round) > 0 })
		if n := recorded(round); n == 0 {
			break
		} else if round == tries-1 {
			t.Fatalf("%d rounds each recorded its ends before the stop (%d in the last), none stopped with three gathered", tries, n)
		}
		t.Logf("round %d: %d of its ends recorded before the stop (the accountant's leadership lost?); trying again", round, recorded(round))
	}
	stop()
	if n := recorded(round); n != 3 {
		t.Errorf("%d accruals after an orderly stop, want the 3 gathered", n)
	}
}

// TestAccountantStopsInOrderEveryTime: an orderly stop records what was
// gathered and writes the cursor whichever the accountant notices first,
// its context's end or its watch's closing (which that end also causes).
// It once returned without either when it saw the closed watch first, as
// it could when stopped just after it caught up (its watch opened on an
// ended context): the next accountant, finding no cursor, counted from
// the statuses as listed and never saw the ends of sessions retired
// meanwhile (CI failed TestRetentionWaitsForTheAccountant that way).
// Thirty stops just after catching up from no cursor, then thirty with an
// end gathered and not yet recorded (most of them: a round whose
// accountant lost its leadership has recorded the end before the stop).
func TestAccountantStopsInOrderEveryTime(t *testing.T) {
	cli := etcdtest.New(t)
	d := usageDriver{t: t, cli: cli}
	ctx := context.Background()
	// The accountants' log (debug), shown when the test fails.
	var logs testlog.Buffer
	var current *Accountant // the round's, for the failure's account
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		s := logs.String()
		t.Logf("the accountants' log, its last 8 KB:\n%s", s[max(0, len(s)-8192):])
		if a := current; a != nil {
			cur, _, err := state.Get[state.UsageCursor](ctx, cli, keys.UsageCursor())
			t.Logf("the last accountant: applied to %d, %d gathered, %d accrued, %d catch-ups; cursor %d (%v)",
				a.Applied(), a.gathered.Load(), a.Accrued(), a.CatchUps(), cur.Revision, err)
		}
	})
	quietCfg := AccountantConfig{Keys: keys, CursorEvery: time.Hour, Gather: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	cursor := func(round int) int64 {
		t.Helper()
		cur, _, err := state.Get[state.UsageCursor](ctx, cli, keys.UsageCursor())
		if err != nil {
			t.Fatalf("round %d: read the cursor after an orderly stop: %v", round, err)
		}
		return cur.Revision
	}
	const rounds = 30
	// A watch opened on an ended context: its channel may close before
	// the accountant looks at the context.
	for r := range 100 {
		resp, err := cli.Delete(ctx, keys.UsageCursor())
		if err != nil {
			t.Fatal(err)
		}
		a := NewAccountant(cli, quietCfg)
		a.setApplied(resp.Header.Revision)
		ended, cancel := context.WithCancel(ctx)
		cancel()
		if err := a.watch(ended, resp.Header.Revision+1); err != nil {
			t.Fatalf("round %d: a watch on an ended context: %v, want an orderly stop", r, err)
		}
		if got := cursor(r); got < resp.Header.Revision {
			t.Fatalf("round %d: cursor at %d after a watch on an ended context, want %d", r, got, resp.Header.Revision)
		}
	}
	for r := range rounds {
		if _, err := cli.Delete(ctx, keys.UsageCursor()); err != nil {
			t.Fatal(err)
		}
		acc, stop := runAccountantWith(t, cli, quietCfg)
		waitUntil(t, "the accountant to catch up", func() bool { return acc.Applied() > 0 })
		stop()
		if got, want := cursor(r), acc.Applied(); got < want {
			t.Fatalf("round %d: cursor at %d after stopping just after catching up, want %d", r, got, want)
		}
	}
	day := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	stoppedGathering := 0
	for r := range rounds {
		fmt.Fprintf(&logs, "-- round %d, an end gathered\n", r)
		acc, stop := runAccountantWith(t, cli, quietCfg)
		current = acc
		id := fmt.Sprintf("s-round-%02d", r)
		d.create(id, "ada", "", 1, day)
		d.finish(d.run(id, 0, int64(10+r), day), day.Add(time.Hour))
		// Gathered, or already recorded by some other path (a catch-up,
		// say), which this round then does not test; most rounds must
		// stop with the end gathered. CI once waited 30 s here for an
		// end neither gathered nor recorded, and what the accountant did
		// then is not known: the log is shown on a failure now.
		gathered := false
		waitUntil(t, fmt.Sprintf("round %d's end gathered or recorded", r), func() bool {
			if acc.gathered.Load() == 1 {
				gathered = true
				return true
			}
			_, recorded := d.accruals()[keys.Accrual(id, int64(10+r))]
			return recorded
		})
		if gathered {
			stoppedGathering++
		} else {
			t.Logf("round %d: the end was recorded before the stop; this round does not stop with it gathered", r)
		}
		last, err := cli.Get(ctx, keys.Status(id))
		if err != nil {
			t.Fatal(err)
		}
		stop()
		if n := len(d.accruals()); n != r+1 {
			t.Fatalf("round %d: %d accruals after an orderly stop, want %d", r, n, r+1)
		}
		if got, ended := cursor(r), last.Kvs[0].ModRevision; got < ended {
			t.Fatalf("round %d: cursor at %d after an orderly stop, want at least %d (the end it recorded)", r, got, ended)
		}
	}
	if stoppedGathering < rounds/2 {
		t.Errorf("%d of %d rounds stopped with an end gathered, want most: the others recorded it before the stop", stoppedGathering, rounds)
	}
}

// TestAccountantSweepsRetiredMarksWhenElected: an accountant deletes the
// accruals of retired sessions (status gone) when it is elected, not only
// SweepEvery later (an hour by default, which an accountant restarted
// more often never reached, so accruals grew without end), in batches
// (250 retired sessions, more than two transactions' worth), and keeps
// the accruals of sessions still in etcd. The daily GPU-time stays.
func TestAccountantSweepsRetiredMarksWhenElected(t *testing.T) {
	cli := etcdtest.New(t)
	d := usageDriver{t: t, cli: cli}
	acc, stop := runAccountant(t, cli)
	waitUntil(t, "the accountant to lead", func() bool { return acc.Applied() > 0 })
	day := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	const retired, kept = 250, 3
	d.hourLong(0, retired+kept, day)
	waitUntil(t, "every attempt accounted", func() bool { return len(d.accruals()) == retired+kept })
	stop()
	for i := range retired {
		if _, err := cli.Delete(context.Background(), keys.Status(fmt.Sprintf("s-%03d", i))); err != nil {
			t.Fatal(err)
		}
	}
	// The hourly default: only the sweep at election can delete them.
	runAccountantWith(t, cli, AccountantConfig{Keys: keys, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	waitUntil(t, "the retired sessions' accruals swept", func() bool { return len(d.accruals()) == kept })
	for i := retired; i < retired+kept; i++ {
		if _, ok := d.accruals()[keys.Accrual(fmt.Sprintf("s-%03d", i), int64(10+i))]; !ok {
			t.Errorf("s-%03d's accrual was swept; its status is still in etcd", i)
		}
	}
	if got := d.day("2026-11-20"); got.Attempts != retired+kept || got.GPUMilliseconds["/ada"] != (retired+kept)*3600000 {
		t.Errorf("day after the sweep: %d attempts, %d ms; want %d attempts of an hour", got.Attempts, got.GPUMilliseconds["/ada"], retired+kept)
	}
}

// TestAccountantCatchesUpInBatchesPastCompaction: an accountant whose
// cursor is behind etcd's compaction counts from the statuses as listed,
// and records only the ended attempts that have no accrual yet, up to
// state.MaxAccrueAll in a transaction. One read and one transaction an
// ended status, every one etcd held, took longer than the soak's history
// lasted once thousands of finished sessions waited on it: each catch-up
// ended behind compaction again.
func TestAccountantCatchesUpInBatchesPastCompaction(t *testing.T) {
	cli := etcdtest.New(t)
	d := usageDriver{t: t, cli: cli}
	acc, stop := runAccountant(t, cli)
	waitUntil(t, "the accountant to lead", func() bool { return acc.Applied() > 0 })
	day := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	const before, while = 40, 300
	d.hourLong(0, before, day)
	waitUntil(t, "the first attempts accounted", func() bool { return len(d.accruals()) == before })
	stop()
	// Ended while no accountant ran, then compacted past its cursor.
	d.hourLong(before, before+while, day)
	r, err := cli.Get(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(context.Background(), r.Header.Revision); err != nil {
		t.Fatal(err)
	}
	acc, _ = runAccountant(t, cli)
	waitUntil(t, "every attempt accounted", func() bool { return len(d.accruals()) == before+while })
	if n := acc.CatchUps(); n != 1 {
		t.Errorf("the accountant caught up %d times, want once (its cursor was behind compaction)", n)
	}
	resp, err := cli.Get(context.Background(), keys.Accruals(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	revs := map[int64]bool{}
	for _, kv := range resp.Kvs {
		if kv.ModRevision > r.Header.Revision {
			revs[kv.ModRevision] = true
		}
	}
	if want := (while + state.MaxAccrueAll - 1) / state.MaxAccrueAll; len(revs) > want {
		t.Errorf("the %d attempts of the catch-up were recorded in %d transactions, want at most %d", while, len(revs), want)
	}
	if got := d.day("2026-11-20"); got.Attempts != before+while || got.GPUMilliseconds["/ada"] != (before+while)*3600000 {
		t.Errorf("day: %d attempts, %d ms; want %d attempts of an hour, each once", got.Attempts, got.GPUMilliseconds["/ada"], before+while)
	}
	if n := acc.Late(); n != 0 {
		t.Errorf("%d attempts late, want none", n)
	}
}

// TestAccountantLearnsFinishedRunTimes: attempts that end their sessions
// (Succeeded, Failed, Stopped) add their GPUs and seconds to their
// owners' records (runtimes/<owner>), as the changes are watched and as a
// catch-up lists them; attempts cut short (a back-off, a lost node's
// re-queue, a lost node) add none, nor does their session's next attempt
// until it finishes.
func TestAccountantLearnsFinishedRunTimes(t *testing.T) {
	cli := etcdtest.New(t)
	d := usageDriver{t: t, cli: cli}
	acc, stop := runAccountant(t, cli)
	waitUntil(t, "the accountant to lead", func() bool { return acc.Applied() > 0 })
	day := time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	h := func(x float64) time.Time { return day.Add(time.Duration(x * float64(time.Hour))) }
	end := func(st state.Status, phase state.Phase, at time.Time) {
		t.Helper()
		st.Phase, st.Finished, st.Updated = phase, &at, at
		d.status(st)
	}
	record := func(owner string) (state.RuntimeRecord, bool) {
		t.Helper()
		r, _, err := state.Get[state.RuntimeRecord](context.Background(), cli, keys.Runtimes(owner))
		if errors.Is(err, state.ErrNotFound) {
			return r, false
		}
		if err != nil {
			t.Fatal(err)
		}
		return r, true
	}

	// ada: 2 GPUs for 90 minutes, succeeded; 4 GPUs for an hour, failed.
	d.create("s-a1", "ada", "vision", 2, h(9))
	d.finish(d.run("s-a1", 0, 10, h(9)), h(10.5))
	d.create("s-a2", "ada", "vision", 4, h(11))
	end(d.run("s-a2", 0, 20, h(11)), state.PhaseFailed, h(12))
	// bob: an hour, backs off (cut short), then 2 h more, stopped.
	d.create("s-b1", "bob", "", 1, h(12))
	st := d.run("s-b1", 0, 30, h(12))
	retry := h(13.5)
	st.Phase, st.Reason, st.RetryAt, st.Updated = state.PhasePending, state.ReasonBackOff, &retry, h(13)
	d.status(st)
	d.status(state.Status{Session: "s-b1", Phase: state.PhasePending, Reason: "Queued", Attempt: 1, Updated: retry})
	end(d.run("s-b1", 1, 40, h(14)), state.PhaseStopped, h(16))
	// cyd: re-queued after a lost node; dan: lost. Both cut short.
	d.create("s-c1", "cyd", "", 2, h(12))
	d.run("s-c1", 0, 50, h(12))
	d.status(state.Status{Session: "s-c1", Phase: state.PhasePending, Reason: "NodeLost", Attempt: 1, Updated: h(13)})
	d.create("s-d1", "dan", "", 2, h(12))
	st = d.run("s-d1", 0, 60, h(12))
	st.Phase, st.Finished, st.Updated = state.PhaseLost, ptr(h(14)), h(14)
	last, err := state.Put(context.Background(), cli, keys.Status("s-d1"), st)
	if err != nil {
		t.Fatal(err)
	}
	// Past the last change, every batch is recorded and learned.
	waitUntil(t, "the accountant past the ends", func() bool { return acc.Applied() >= last })
	if n := len(d.accruals()); n != 6 {
		t.Errorf("%d accruals, want 6", n)
	}
	if n := acc.Learned(); n != 3 {
		t.Errorf("%d samples learned, want 3 (ada's two, bob's last)", n)
	}

	sameSamples := func(who string, got []state.RuntimeSample, want []state.RuntimeSample) {
		t.Helper()
		ok := len(got) == len(want)
		for i := 0; ok && i < len(got); i++ {
			g, w := got[i], want[i]
			ok = g.Session == w.Session && g.QueueRevision == w.QueueRevision && g.GPUs == w.GPUs && g.Seconds == w.Seconds && g.Ended.Equal(w.Ended)
		}
		if !ok {
			t.Errorf("%s's samples %+v, want %+v", who, got, want)
		}
	}
	ada, _ := record("ada")
	sameSamples("ada", ada.Samples, []state.RuntimeSample{
		{Session: "s-a1", QueueRevision: 10, GPUs: 2, Seconds: 5400, Ended: h(10.5)},
		{Session: "s-a2", QueueRevision: 20, GPUs: 4, Seconds: 3600, Ended: h(12)},
	})
	bob, _ := record("bob")
	sameSamples("bob", bob.Samples, []state.RuntimeSample{{Session: "s-b1", QueueRevision: 40, GPUs: 1, Seconds: 7200, Ended: h(16)}})
	for _, owner := range []string{"cyd", "dan"} {
		if r, ok := record(owner); ok {
			t.Errorf("%s's attempt was cut short, yet %s has a record: %+v", owner, owner, r)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(acc.Collectors()...)
	if got := counterValue(t, reg, "voyager_usage_runtimes_learned_total"); got != 3 {
		t.Errorf("voyager_usage_runtimes_learned_total %v, want 3", got)
	}

	// While no accountant runs, eve finishes and fay backs off; with no
	// cursor the next accountant catches up from the statuses as listed.
	stop()
	d.create("s-e1", "eve", "", 8, h(18))
	d.finish(d.run("s-e1", 0, 70, h(18)), h(18.25))
	d.create("s-f1", "fay", "", 1, h(18))
	st = d.run("s-f1", 0, 80, h(18))
	retry = h(19.5)
	st.Phase, st.Reason, st.RetryAt, st.Updated = state.PhasePending, state.ReasonBackOff, &retry, h(19)
	d.status(st)
	if _, err := cli.Delete(context.Background(), keys.UsageCursor()); err != nil {
		t.Fatal(err)
	}
	a2, _ := runAccountant(t, cli)
	waitUntil(t, "the catch-up", func() bool { return a2.Applied() > 0 })
	if n := len(d.accruals()); n != 8 {
		t.Errorf("%d accruals after the catch-up, want 8", n)
	}
	if n := a2.Learned(); n != 1 {
		t.Errorf("the catch-up learned %d samples, want eve's", n)
	}
	if a2.CatchUps() != 1 {
		t.Errorf("the second accountant caught up %d times, want once", a2.CatchUps())
	}
	eve, _ := record("eve")
	sameSamples("eve", eve.Samples, []state.RuntimeSample{{Session: "s-e1", QueueRevision: 70, GPUs: 8, Seconds: 900, Ended: h(18.25)}})
	if r, ok := record("fay"); ok {
		t.Errorf("fay's attempt backed off, yet she has a record: %+v", r)
	}
	if again, _ := record("ada"); len(again.Samples) != 2 {
		t.Errorf("ada's samples after the catch-up: %+v, want her two kept once", again.Samples)
	}
}

// counterValue is the value of the counter named name in reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
