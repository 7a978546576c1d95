package state_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

var runtimesDay = time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)

// sample is attempt qr of session id: gpus GPUs for secs seconds, ended
// at minute m of runtimesDay.
func sample(id string, qr int64, gpus int, secs int64, m int) state.RuntimeSample {
	return state.RuntimeSample{Session: id, QueueRevision: qr, GPUs: gpus, Seconds: secs, Ended: runtimesDay.Add(time.Duration(m) * time.Minute)}
}

// ids is each sample's session and queue revision, in the record's order.
func ids(r state.RuntimeRecord) []string {
	out := make([]string, len(r.Samples))
	for i, s := range r.Samples {
		out[i] = fmt.Sprintf("%s/%d", s.Session, s.QueueRevision)
	}
	return out
}

// TestRuntimeRecordAdd: samples are kept in order of their ends whatever
// order they come in; an attempt added again is kept once; past
// RuntimeSamplesKept the oldest go, and one older than every sample of a
// full record is not added (nor counted as added).
func TestRuntimeRecordAdd(t *testing.T) {
	t.Run("order", func(t *testing.T) {
		var r state.RuntimeRecord
		for _, s := range []state.RuntimeSample{sample("b", 2, 1, 60, 20), sample("a", 1, 1, 60, 10), sample("d", 4, 1, 60, 40), sample("c", 3, 1, 60, 30)} {
			if !r.Add(s) {
				t.Fatalf("Add(%s) = false on a record without it", s.Session)
			}
		}
		if got, want := ids(r), []string{"a/1", "b/2", "c/3", "d/4"}; !slices.Equal(got, want) {
			t.Errorf("samples %v, want %v (by their ends)", got, want)
		}
	})
	t.Run("dedupe", func(t *testing.T) {
		var r state.RuntimeRecord
		r.Add(sample("a", 1, 1, 60, 10))
		r.Add(sample("a", 2, 1, 60, 20)) // another attempt of a: kept
		if r.Add(sample("a", 1, 8, 999, 30)) {
			t.Error("Add of an attempt the record holds = true")
		}
		if got, want := ids(r), []string{"a/1", "a/2"}; !slices.Equal(got, want) || r.Samples[0].GPUs != 1 {
			t.Errorf("samples %v (first %+v), want %v unchanged", got, r.Samples[0], want)
		}
	})
	t.Run("trim", func(t *testing.T) {
		var r state.RuntimeRecord
		n := state.RuntimeSamplesKept + 5
		for i := range n {
			if !r.Add(sample(fmt.Sprintf("s%02d", i), int64(i+1), 1, 60, i+10)) {
				t.Fatalf("Add %d = false", i)
			}
		}
		if len(r.Samples) != state.RuntimeSamplesKept {
			t.Fatalf("%d samples kept, want %d", len(r.Samples), state.RuntimeSamplesKept)
		}
		if first, last := r.Samples[0].Session, r.Samples[len(r.Samples)-1].Session; first != "s05" || last != fmt.Sprintf("s%02d", n-1) {
			t.Errorf("kept %s … %s, want the newest: s05 … s%02d", first, last, n-1)
		}
		// An attempt trimmed away, seen again: older than all kept.
		before := ids(r)
		if r.Add(sample("s00", 1, 1, 60, 10)) {
			t.Error("Add of an attempt older than every sample of a full record = true")
		}
		if !slices.Equal(ids(r), before) {
			t.Errorf("samples changed by a refused Add: %v", ids(r))
		}
		// A newer one goes in and pushes the oldest out.
		if !r.Add(sample("new", 99, 1, 60, 1000)) || r.Samples[0].Session != "s06" || len(r.Samples) != state.RuntimeSamplesKept {
			t.Errorf("after a new sample: %d samples from %s", len(r.Samples), r.Samples[0].Session)
		}
	})
}

// TestRuntimeRecordEstimate: the longest of the owner's last EstimateOver
// finished attempts of the size asked, when every one of them declared at
// least OverstatedBy times what it ran; zero (plan with the bound) with
// fewer of that size, one that declared none or about what it ran among
// them, or no record. Older attempts and other sizes do not count.
func TestRuntimeRecordEstimate(t *testing.T) {
	const day = int64(24 * 3600)
	over := func(secs int64) int64 { return state.OverstatedBy * secs } // declared just enough
	// of is a record of runs of 2 GPUs (oldest first): run i held them
	// secs[i] seconds and declared declared[i].
	of := func(secs []int64, declared []int64) *state.RuntimeRecord {
		r := &state.RuntimeRecord{}
		for i := range secs {
			s := sample(fmt.Sprintf("s%d", i), int64(i+1), 2, secs[i], 10*(i+1))
			s.Declared = declared[i]
			r.Add(s)
		}
		return r
	}
	// Eight runs of 2 GPUs, 10 to 30 minutes (within 3×), each declaring a
	// day: the habit.
	runs := []int64{600, 1800, 1200, 900, 1500, 700, 1100, 1300}
	days := func(n int) []int64 {
		d := make([]int64, n)
		for i := range d {
			d[i] = day
		}
		return d
	}
	with := func(xs []int64, i int, v int64) []int64 { // xs with xs[i] = v
		out := append([]int64(nil), xs...)
		out[i] = v
		return out
	}
	habit := of(runs, days(len(runs)))
	// Interleaved with other sizes, which do not count.
	mixed := of(runs, days(len(runs)))
	for i, g := range []int{4, 1} {
		s := sample(fmt.Sprintf("x%d", i), int64(100+i), g, 7*3600, 15+10*i)
		s.Declared = day
		mixed.Add(s)
	}
	overs := make([]int64, len(runs))
	for i, r := range runs {
		overs[i] = over(r)
	}
	for _, c := range []struct {
		name string
		rec  *state.RuntimeRecord
		gpus int
		want time.Duration
	}{
		{"the longest of the last runs", habit, 2, 1800 * time.Second},
		{"other sizes skipped", mixed, 2, 1800 * time.Second},
		{"none of the size", habit, 8, 0},
		{"too few of the size", of(runs[:state.EstimateOver-1], days(state.EstimateOver-1)), 2, 0},
		{"declared just enough", of(runs, overs), 2, 1800 * time.Second},
		{"one declared about what it ran", of(runs, with(overs, 1, over(1800)-1)), 2, 0},
		{"one declared none", of(runs, with(days(len(runs)), 2, 0)), 2, 0},
		{"runs just consistent enough", of(with(runs, 0, 2400), days(len(runs))), 2, 2400 * time.Second},
		{"runs that vary more than 4×", of(with(runs, 0, 2801), days(len(runs))), 2, 0},
		// Only the last EstimateOver count: an older run, longer and
		// declared about what it ran, changes nothing.
		{"older runs ignored", of(append([]int64{7200}, runs...), append([]int64{7200}, days(len(runs))...)), 2, 1800 * time.Second},
		{"empty record", &state.RuntimeRecord{}, 2, 0},
		{"no record", nil, 2, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := c.rec.Estimate(c.gpus); got != c.want {
				t.Errorf("Estimate(%d) = %v, want %v", c.gpus, got, c.want)
			}
		})
	}
}

// TestLearnRuntimes: finished attempts' accruals (written by Accrue) go
// into their owners' records with their GPUs, seconds and the max runtime
// their specs declared (none: 0); an attempt
// without an accrual is skipped; learned twice, an attempt is kept once
// and nothing is written; a record written by another accountant between
// the read and the transaction refuses it, and the retry keeps both
// samples.
func TestLearnRuntimes(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	k := state.MustKeys("/t")
	h := func(x float64) time.Time { return runtimesDay.Add(time.Duration(x * float64(time.Hour))) }
	accrue := func(id, owner string, qr int64, gpus int, bound, ended time.Time) {
		t.Helper()
		spec := state.Session{ID: id, Owner: owner, Kind: state.KindBatch, Resources: state.Resources{GPUs: gpus}}
		if id == "a1" {
			spec.Limits.MaxRuntime = state.Duration(24 * time.Hour)
		}
		if _, err := state.Put(ctx, cli, k.Session(id), spec); err != nil {
			t.Fatal(err)
		}
		if _, err := state.Put(ctx, cli, k.Status(id), state.Status{Session: id, Phase: state.PhaseSucceeded}); err != nil {
			t.Fatal(err)
		}
		a := state.Accrual{Session: id, Owner: owner, QueueRevision: qr, GPUs: gpus, Bound: bound, Ended: ended}
		if done, err := state.Accrue(ctx, cli, k, a, nil, ended); err != nil || !done {
			t.Fatalf("Accrue %s: %v, %v", id, done, err)
		}
	}
	record := func(owner string) (state.RuntimeRecord, int64) {
		t.Helper()
		r, rev, err := state.Get[state.RuntimeRecord](ctx, cli, k.Runtimes(owner))
		if err != nil {
			t.Fatalf("runtimes/%s: %v", owner, err)
		}
		return r, rev
	}
	accrue("a1", "ada", 10, 2, h(9), h(10.5))
	accrue("b1", "bob", 20, 1, h(23), h(25.5)) // over midnight
	accrue("a2", "ada", 30, 4, h(12), h(13))
	now := h(30)
	attempts := []state.AttemptKey{{Session: "a1", QueueRevision: 10}, {Session: "b1", QueueRevision: 20},
		{Session: "a2", QueueRevision: 30}, {Session: "gone", QueueRevision: 40}}
	n, err := state.LearnRuntimes(ctx, cli, k, attempts, now)
	if err != nil || n != 3 {
		t.Fatalf("LearnRuntimes = %d, %v; want 3 samples", n, err)
	}
	ada, adaRev := record("ada")
	want := []state.RuntimeSample{
		{Session: "a1", QueueRevision: 10, GPUs: 2, Seconds: 5400, Declared: 24 * 3600, Ended: h(10.5)},
		{Session: "a2", QueueRevision: 30, GPUs: 4, Seconds: 3600, Ended: h(13)},
	}
	if ada.Owner != "ada" || !ada.Updated.Equal(now) || !slices.EqualFunc(ada.Samples, want, sameSample) {
		t.Errorf("ada's record %+v, want %+v updated %v", ada, want, now)
	}
	if bob, _ := record("bob"); len(bob.Samples) != 1 || !sameSample(bob.Samples[0], state.RuntimeSample{Session: "b1", QueueRevision: 20, GPUs: 1, Seconds: 9000, Ended: h(25.5)}) {
		t.Errorf("bob's record %+v", bob)
	}
	if r, err := cli.Get(ctx, k.RuntimesDir(), clientv3.WithPrefix(), clientv3.WithKeysOnly()); err != nil || len(r.Kvs) != 2 {
		t.Errorf("records under runtimes/: %v, %v; want ada's and bob's", r.Kvs, err)
	}

	// Learned again (a replay): nothing added, nothing written.
	if n, err := state.LearnRuntimes(ctx, cli, k, attempts[:1], h(31)); err != nil || n != 0 {
		t.Errorf("LearnRuntimes again = %d, %v; want 0", n, err)
	}
	if again, rev := record("ada"); rev != adaRev || len(again.Samples) != 2 {
		t.Errorf("ada's record after learning a1 again: revision %d (was %d), %d samples", rev, adaRev, len(again.Samples))
	}

	// Another accountant adds a3 to ada's record after this one read it.
	accrue("a3", "ada", 50, 2, h(14), h(15))
	accrue("a4", "ada", 60, 2, h(14), h(16))
	mover := &movingKV{KV: cli, move: func() {
		if n, err := state.LearnRuntimes(ctx, cli, k, []state.AttemptKey{{Session: "a3", QueueRevision: 50}}, h(32)); err != nil || n != 1 {
			t.Errorf("the other accountant's LearnRuntimes = %d, %v", n, err)
		}
	}}
	if n, err := state.LearnRuntimes(ctx, mover, k, []state.AttemptKey{{Session: "a4", QueueRevision: 60}}, h(33)); err != nil || n != 1 {
		t.Fatalf("LearnRuntimes beside another = %d, %v; want 1 after a retry", n, err)
	}
	if !mover.moved {
		t.Fatal("the other accountant never wrote: the test did not race")
	}
	ada, _ = record("ada")
	if got, want := ids(ada), []string{"a1/10", "a2/30", "a3/50", "a4/60"}; !slices.Equal(got, want) {
		t.Errorf("ada's samples %v, want %v (neither accountant's lost)", got, want)
	}
}

func sameSample(a, b state.RuntimeSample) bool {
	return a.Session == b.Session && a.QueueRevision == b.QueueRevision && a.GPUs == b.GPUs && a.Seconds == b.Seconds &&
		a.Declared == b.Declared && a.Ended.Equal(b.Ended)
}
