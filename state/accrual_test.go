package state_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// TestSplitByDayAndEndedAttempts: GPU-time split at UTC midnights sums
// to the whole, to the millisecond; a status change ends an attempt only
// when it leaves the bound phases or names another queueing.
func TestSplitByDayAndEndedAttempts(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for range 500 {
		from := base.Add(time.Duration(r.Int64N(int64(30 * 24 * time.Hour))))
		to := from.Add(time.Duration(r.Int64N(int64(5 * 24 * time.Hour))))
		gpus := 1 + r.IntN(8)
		days := state.SplitByDay(gpus, from, to)
		var sum int64
		for d, ms := range days {
			if ms < 0 || ms > int64(gpus)*24*3600*1000 {
				t.Fatalf("day %s holds %d ms of %d GPUs", d, ms, gpus)
			}
			sum += ms
		}
		if want := state.GPUMillis(gpus, from, to); sum != want {
			t.Fatalf("[%s, %s) × %d: days sum to %d ms, want %d", from, to, gpus, sum, want)
		}
	}
	if d := state.SplitByDay(2, base.Add(23*time.Hour), base.Add(25*time.Hour)); d["2026-11-01"] != 2*3600000 || d["2026-11-02"] != 2*3600000 {
		t.Errorf("over midnight: %v", d)
	}
	bound, end := base.Add(time.Hour), base.Add(3*time.Hour)
	running := &state.Status{Phase: state.PhaseRunning, Bound: &bound, QueueRevision: 9, Attempt: 1}
	for _, c := range []struct {
		name string
		cur  *state.Status
		ok   bool
		end  time.Time
	}{
		{"still running", &state.Status{Phase: state.PhaseRunning, Bound: &bound, QueueRevision: 9}, false, time.Time{}},
		{"stopping", &state.Status{Phase: state.PhaseStopping, Bound: &bound, QueueRevision: 9}, false, time.Time{}},
		{"succeeded", &state.Status{Phase: state.PhaseSucceeded, Bound: &bound, QueueRevision: 9, Finished: &end, Updated: end.Add(time.Second)}, true, end},
		{"backed off", &state.Status{Phase: state.PhasePending, Reason: state.ReasonBackOff, Bound: &bound, QueueRevision: 9, Updated: end}, true, end},
		{"lost and re-queued", &state.Status{Phase: state.PhasePending, Reason: "NodeLost", Updated: end}, true, end},
		{"deleted", nil, true, end},
	} {
		qr, att, b, e, ok := state.EndedAttempt(running, c.cur, end)
		if ok != c.ok || (ok && (qr != 9 || att != 1 || !b.Equal(bound) || !e.Equal(c.end))) {
			t.Errorf("%s: ended %v (qr %d attempt %d, %s to %s)", c.name, ok, qr, att, b, e)
		}
	}
	if _, _, _, _, ok := state.EndedAttempt(&state.Status{Phase: state.PhasePending}, running, end); ok {
		t.Error("a bind ended an attempt")
	}
}
