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
