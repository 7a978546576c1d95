package state_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/state"
)

// TestMachineEveryTransition tries every event in every phase under every
// combination of facts, and compares the answer with a table written out
// here by hand: each legal move, with the facts it needs. Everything not in
// the table must be refused with ErrIllegalTransition.
func TestMachineEveryTransition(t *testing.T) {
	P, B, St, R, Sg := state.PhasePending, state.PhaseBound, state.PhaseStarting, state.PhaseRunning, state.PhaseStopping
	live := []state.Phase{B, St, R, Sg}
	type legal struct {
		to   state.Phase
		when func(state.Facts) bool
	}
	want := map[state.Phase]map[state.Event]legal{}
	add := func(ev state.Event, from []state.Phase, to state.Phase, when func(state.Facts) bool) {
		for _, f := range from {
			if want[f] == nil {
				want[f] = map[state.Event]legal{}
			}
			dst := to
			if dst == "" {
				dst = f
			}
			want[f][ev] = legal{dst, when}
		}
	}
	yes := func(state.Facts) bool { return true }
	isBound := func(f state.Facts) bool { return f.Bound }
	add(state.EventSubmit, []state.Phase{""}, P, yes)
	add(state.EventExplain, []state.Phase{P}, P, func(f state.Facts) bool { return f.Queued })
	add(state.EventBind, []state.Phase{P}, B, func(f state.Facts) bool { return f.Queued })
	add(state.EventCancel, []state.Phase{P}, state.PhaseStopped, func(f state.Facts) bool { return f.DesiredStopped && (f.Queued || f.Waiting) })
	add(state.EventRequeue, []state.Phase{P}, P, func(f state.Facts) bool { return f.Waiting && !f.Queued && !f.DesiredStopped })
	add(state.EventCreate, []state.Phase{B, St}, St, isBound)
	add(state.EventStart, []state.Phase{B, St, R}, R, isBound)
	add(state.EventObserve, []state.Phase{St, R, Sg}, "", isBound)
	add(state.EventStop, live, Sg, isBound)
	add(state.EventSucceed, live, state.PhaseSucceeded, isBound)
	add(state.EventFail, live, state.PhaseFailed, isBound)
	add(state.EventHalt, live, state.PhaseStopped, isBound)
	add(state.EventBackOff, live, P, func(f state.Facts) bool { return f.Bound && f.RestartsLeft && !f.DesiredStopped })
	add(state.EventPreempt, live, P, func(f state.Facts) bool { return f.Bound && f.Requeue && !f.DesiredStopped })
	add(state.EventResize, live, P, func(f state.Facts) bool { return f.Bound && f.Requeue && f.Resize && !f.DesiredStopped })
	add(state.EventLostRequeue, live, P, func(f state.Facts) bool { return f.RestartsLeft && !f.DesiredStopped && !f.Queued })
	add(state.EventLose, live, state.PhaseLost, func(f state.Facts) bool { return !f.DesiredStopped })
	add(state.EventLostStopped, live, state.PhaseStopped, func(f state.Facts) bool { return f.DesiredStopped })
	add(state.EventFenced, live, P, func(f state.Facts) bool { return f.Bound && f.RestartsLeft && !f.DesiredStopped })
	add(state.EventFencedLost, live, state.PhaseLost, func(f state.Facts) bool { return f.Bound && !f.DesiredStopped })

	events := []state.Event{state.EventSubmit, state.EventExplain, state.EventBind, state.EventCancel, state.EventRequeue,
		state.EventCreate, state.EventStart, state.EventObserve, state.EventStop, state.EventSucceed, state.EventFail,
		state.EventHalt, state.EventBackOff, state.EventPreempt, state.EventResize, state.EventLostRequeue, state.EventLose, state.EventLostStopped,
		state.EventFenced, state.EventFencedLost}
	if len(events) != len(state.Machine) {
		t.Fatalf("the test knows %d events, the machine has %d rows: add the new event here", len(events), len(state.Machine))
	}
	phases := append([]state.Phase{""}, state.Phases()...)
	legalMoves, refusals := 0, 0
	for _, from := range phases {
		for _, ev := range events {
			for bits := 0; bits < 128; bits++ {
				f := state.Facts{Queued: bits&1 != 0, Waiting: bits&2 != 0, Bound: bits&4 != 0,
					DesiredStopped: bits&8 != 0, RestartsLeft: bits&16 != 0, Requeue: bits&32 != 0, Resize: bits&64 != 0}
				name := fmt.Sprintf("%s/%s/%+v", from, ev, f)
				got, err := state.Next(from, ev, f)
				l, ok := want[from][ev]
				if ok && l.when(f) {
					legalMoves++
					if err != nil || got != l.to {
						t.Errorf("%s = %s, %v; want %s", name, got, err, l.to)
					}
					if okEdge, _ := state.Edge(from, got); !okEdge && from != "" {
						t.Errorf("%s: Edge(%s, %s) = false for a legal move", name, from, got)
					}
					continue
				}
				refusals++
				if !errors.Is(err, state.ErrIllegalTransition) || got != "" {
					t.Errorf("%s = %q, %v; want ErrIllegalTransition", name, got, err)
				}
			}
		}
	}
	if legalMoves == 0 || refusals == 0 {
		t.Fatalf("legal %d, refused %d: the table test tried nothing", legalMoves, refusals)
	}
}

// TestEdge is the checker's view: which phase changes some event allows.
func TestEdge(t *testing.T) {
	for _, tc := range []struct {
		from, to state.Phase
		ok       bool
	}{
		{state.PhasePending, state.PhaseBound, true},
		{state.PhasePending, state.PhasePending, true},
		{state.PhasePending, state.PhaseRunning, false},
		{state.PhaseBound, state.PhaseRunning, true},
		{state.PhaseRunning, state.PhasePending, true}, // back-off, preemption, node loss
		{state.PhaseRunning, state.PhaseStarting, false},
		{state.PhaseStopping, state.PhaseRunning, false},
		{state.PhaseSucceeded, state.PhasePending, false}, // a finished session is never re-queued
		{state.PhaseStopped, state.PhaseRunning, false},
		{state.PhaseLost, state.PhaseLost, false},
		{state.PhaseFailed, "", true},   // retention deletes a finished status
		{state.PhaseRunning, "", false}, // never a live one
	} {
		if ok, evs := state.Edge(tc.from, tc.to); ok != tc.ok {
			t.Errorf("Edge(%s, %s) = %v (%v), want %v", tc.from, tc.to, ok, evs, tc.ok)
		}
	}
}

// TestMachineTableInArchitectureDoc keeps docs/architecture.md's drawing
// of the state machine equal to Machine.
func TestMachineTableInArchitectureDoc(t *testing.T) {
	doc, err := os.ReadFile("../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), state.MachineTable()) {
		t.Errorf("docs/architecture.md does not carry the state machine's table; put this in it:\n%s", state.MachineTable())
	}
}
