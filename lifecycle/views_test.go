package lifecycle

import (
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// viewOf stores w as JSON and decodes its view with dec.
func viewOf[W, V any](t *testing.T, dec watcher.DecodeFunc[V], w W) V {
	t.Helper()
	val, err := state.Encode(w)
	if err != nil {
		t.Fatal(err)
	}
	v, err := dec("k", []byte(val))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The views keep what the rules read of specs and statuses, decoded from
// the stored JSON, with the same answers as the whole values.
func TestViewsAnswerAsTheWholeValues(t *testing.T) {
	at := time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)
	later := at.Add(time.Hour)
	specs := map[string]state.Session{
		"running notebook": {ID: "a", Kind: state.KindNotebook, Desired: state.DesiredRunning,
			Limits: state.Limits{MaxRuntime: state.Duration(time.Hour), IdleTimeout: state.Duration(time.Minute)}},
		"stopped batch": {ID: "b", Kind: state.KindBatch, Desired: state.DesiredStopped},
		"evicted":       {ID: "c", Kind: state.KindBatch, Desired: state.DesiredRunning, Eviction: &state.Eviction{Reason: state.ReasonPreempted}},
	}
	for name, s := range specs {
		v := viewOf(t, decodeSpec, s)
		if v.stopping() != s.Stopping() || v.notebook != (s.Kind == state.KindNotebook) || v.stopped != (s.Desired == state.DesiredStopped) ||
			v.maxRuntime != s.Limits.MaxRuntime.Std() || v.idleTimeout != s.Limits.IdleTimeout.Std() {
			t.Errorf("%s: view %+v of %+v", name, v, s)
		}
	}
	statuses := map[string]state.Status{
		"pending":      {Phase: state.PhasePending, Reason: "Capacity"},
		"backing off":  {Phase: state.PhasePending, Reason: state.ReasonBackOff, RetryAt: &later},
		"preempted":    {Phase: state.PhasePending, Reason: state.ReasonPreempted, RetryAt: &later},
		"running":      {Phase: state.PhaseRunning, Started: &at, Activity: &state.Activity{LastActive: later}},
		"never looked": {Phase: state.PhaseRunning, Started: &at},
		"lost":         {Phase: state.PhaseLost},
		"succeeded":    {Phase: state.PhaseSucceeded, Started: &at},
	}
	for name, st := range statuses {
		v := viewOf(t, decodeStatus, st)
		ok := v.terminal == st.Phase.Terminal() && v.running == (st.Phase == state.PhaseRunning) && v.waiting == st.Waiting() &&
			v.sampled == (st.Activity != nil) && v.started.IsZero() == (st.Started == nil) && v.retryAt.IsZero() == (st.RetryAt == nil)
		if st.Started != nil && !v.started.Equal(*st.Started) || st.RetryAt != nil && !v.retryAt.Equal(*st.RetryAt) ||
			st.Activity != nil && !v.lastActive.Equal(st.Activity.LastActive) {
			ok = false
		}
		if !ok {
			t.Errorf("%s: view %+v of %+v", name, v, st)
		}
	}
	if _, err := decodeStatus("status/x", []byte("{")); err == nil {
		t.Error("a broken status decoded")
	}
	if _, err := decodeSpec("sessions/x", []byte("{")); err == nil {
		t.Error("a broken spec decoded")
	}
}
