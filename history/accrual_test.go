package history_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/history"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// TestCheckerFindsBrokenAccruals: histories that count an attempt's
// GPU-hours twice, before it ended, or for another bound time each break
// one accounting rule at one revision; state.Accrue's own write, earlier
// in each history, breaks none.
func TestCheckerFindsBrokenAccruals(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	bound := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	ended := bound.Add(90 * time.Minute)
	st := func(p state.Phase, qr int64) state.Status {
		s := state.Status{Session: "s1", Phase: p, QueueRevision: qr, Updated: ended}
		if p != state.PhasePending {
			s.Bound = &bound
		}
		if p.Terminal() {
			s.Finished = &ended
		}
		return s
	}
	acc := func(from, to time.Time) state.Accrual {
		return state.Accrual{Session: "s1", Owner: "ada", Team: "vision", QueueRevision: 7, GPUs: 2, Bound: from, Ended: to,
			GPUMilliseconds: state.GPUMillis(2, from, to), Accrued: to}
	}
	for i, tc := range []struct {
		name  string
		steps func(t *testing.T, k state.Keys) int64
		rule  string
	}{
		{"an attempt accrued twice", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Session("s1"), state.Session{ID: "s1", Owner: "ada"}}, put{k.Status("s1"), st(state.PhasePending, 0)})
			write(t, cli, put{k.Status("s1"), st(state.PhaseBound, 7)})
			write(t, cli, put{k.Status("s1"), st(state.PhaseSucceeded, 7)})
			if ok, err := state.Accrue(ctx, cli, k, acc(bound, ended), nil, ended); err != nil || !ok {
				t.Fatalf("accrue: %v, %v", ok, err)
			}
			return write(t, cli, put{k.Accrual("s1", 7), acc(bound, ended)})
		}, history.RuleAccrualTwice},
		{"accrued again after its mark was deleted", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Status("s1"), st(state.PhasePending, 0)})
			write(t, cli, put{k.Status("s1"), st(state.PhaseBound, 7)})
			write(t, cli, put{k.Status("s1"), st(state.PhaseSucceeded, 7)})
			if ok, err := state.Accrue(ctx, cli, k, acc(bound, ended), nil, ended); err != nil || !ok {
				t.Fatalf("accrue: %v, %v", ok, err)
			}
			write(t, cli, put{k.Accrual("s1", 7), nil})
			return write(t, cli, put{k.Accrual("s1", 7), acc(bound, ended)})
		}, history.RuleAccrualTwice},
		{"accrued while the attempt runs", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Status("s1"), st(state.PhasePending, 0)})
			write(t, cli, put{k.Status("s1"), st(state.PhaseBound, 7)})
			write(t, cli, put{k.Status("s1"), st(state.PhaseRunning, 7)})
			return write(t, cli, put{k.Accrual("s1", 7), acc(bound, ended)})
		}, history.RuleAccrualMismatch},
		{"accrued from another bound time", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Status("s1"), st(state.PhasePending, 0)})
			write(t, cli, put{k.Status("s1"), st(state.PhaseBound, 7)})
			write(t, cli, put{k.Status("s1"), st(state.PhaseFailed, 7)})
			return write(t, cli, put{k.Accrual("s1", 7), acc(bound.Add(-time.Hour), ended)})
		}, history.RuleAccrualMismatch},
		{"more GPU-time than GPUs times bound time", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Status("s1"), st(state.PhasePending, 0)})
			write(t, cli, put{k.Status("s1"), st(state.PhaseBound, 7)})
			write(t, cli, put{k.Status("s1"), st(state.PhaseStopped, 7)})
			a := acc(bound, ended)
			a.GPUMilliseconds *= 2
			return write(t, cli, put{k.Accrual("s1", 7), a})
		}, history.RuleAccrualMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := state.MustKeys(fmt.Sprintf("/acct%d", i))
			start := write(t, cli, put{k.Profile("marker"), state.Profile{Name: "marker"}})
			at := tc.steps(t, k)
			end := write(t, cli, put{k.Profile("marker"), state.Profile{Name: "end"}})
			wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			res, err := history.Watch(wctx, cli, k, history.Options{Start: start, End: end})
			if err != nil {
				t.Fatal(err)
			}
			if res.Last < end || res.Count != 1 || len(res.Violations) != 1 {
				t.Fatalf("checked to %d (want %d); violations %d: %v; want exactly one", res.Last, end, res.Count, res.Violations)
			}
			if v := res.Violations[0]; v.Rule != tc.rule || v.Revision != at || v.Key != k.Accrual("s1", 7) {
				t.Errorf("violation %s; want rule %s at revision %d, key %s", v, tc.rule, at, k.Accrual("s1", 7))
			}
		})
	}
}

// TestCheckerFindsRetiredUnaccrued: a finished session retired before its
// bound attempt was accrued (what retention did to the soak's accountant
// before it waited for the accrual) breaks retired-unaccrued at the
// status's delete; one retired after state.Accrue recorded it, and one
// that never bound, break nothing.
func TestCheckerFindsRetiredUnaccrued(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	k := state.MustKeys("/retired")
	bound := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	ended := bound.Add(time.Hour)
	st := func(id string, p state.Phase, qr int64) state.Status {
		s := state.Status{Session: id, Phase: p, QueueRevision: qr, Updated: ended}
		if qr > 0 {
			s.Bound = &bound
		}
		if p.Terminal() {
			s.Finished = &ended
		}
		return s
	}
	start := write(t, cli, put{k.Profile("marker"), state.Profile{Name: "marker"}})
	for _, id := range []string{"s-counted", "s-lost"} {
		write(t, cli, put{k.Session(id), state.Session{ID: id, Owner: "ada", Resources: state.Resources{GPUs: 2}}}, put{k.Status(id), st(id, state.PhasePending, 0)})
		write(t, cli, put{k.Status(id), st(id, state.PhaseBound, 7)})
		write(t, cli, put{k.Status(id), st(id, state.PhaseSucceeded, 7)})
	}
	a := state.Accrual{Session: "s-counted", Owner: "ada", QueueRevision: 7, GPUs: 2, Bound: bound, Ended: ended}
	if ok, err := state.Accrue(ctx, cli, k, a, nil, ended); err != nil || !ok {
		t.Fatalf("accrue: %v, %v", ok, err)
	}
	write(t, cli, put{k.Session("s-never"), state.Session{ID: "s-never", Owner: "ada"}}, put{k.Status("s-never"), st("s-never", state.PhasePending, 0)})
	write(t, cli, put{k.Status("s-never"), st("s-never", state.PhaseStopped, 0)})
	write(t, cli, put{k.Session("s-counted"), nil}, put{k.Status("s-counted"), nil})
	write(t, cli, put{k.Session("s-never"), nil}, put{k.Status("s-never"), nil})
	at := write(t, cli, put{k.Session("s-lost"), nil}, put{k.Status("s-lost"), nil})
	end := write(t, cli, put{k.Profile("marker"), state.Profile{Name: "end"}})
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	res, err := history.Watch(wctx, cli, k, history.Options{Start: start, End: end})
	if err != nil {
		t.Fatal(err)
	}
	if res.Last < end || len(res.Violations) != 1 {
		t.Fatalf("checked to %d (want %d); violations %v; want exactly one", res.Last, end, res.Violations)
	}
	if v := res.Violations[0]; v.Rule != history.RuleRetiredUnaccrued || v.Revision != at || v.Key != k.Status("s-lost") {
		t.Errorf("violation %s; want rule %s at revision %d, key %s", v, history.RuleRetiredUnaccrued, at, k.Status("s-lost"))
	}
}
