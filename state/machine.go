package state

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Event is something that moves a session from one phase to another. Every
// writer of status/<id> names the event it applies and asks Transition for
// the next phase; the transaction that writes it compares what the guard
// was decided from (the status's mod revision, and the binding, queue entry
// or spec it read), so an illegal transition is refused by etcd, not merely
// unlikely.
type Event string

// Session events, by writer.
const (
	// EventSubmit creates the session (API): no status yet → Pending.
	EventSubmit Event = "Submit"
	// EventExplain rewrites a queued session's reason and position (placer).
	EventExplain Event = "Explain"
	// EventBind binds a queued session (placer's bind txn).
	EventBind Event = "Bind"
	// EventCancel ends a session that is queued or waiting to run again
	// once its owner asked it to stop (API StopSession; the lifecycle
	// controller for one that became waiting after the stop).
	EventCancel Event = "Cancel"
	// EventRequeue queues a session that waited to run again (lifecycle
	// controller, after a back-off or a preemption).
	EventRequeue Event = "Requeue"
	// EventCreate reports the agent pulling or creating containers.
	EventCreate Event = "Create"
	// EventStart reports the containers running.
	EventStart Event = "Start"
	// EventObserve rewrites a live phase's details (activity, URLs,
	// messages) without changing the phase.
	EventObserve Event = "Observe"
	// EventStop reports the agent stopping the containers.
	EventStop Event = "Stop"
	// EventSucceed ends a batch session whose command exited 0.
	EventSucceed Event = "Succeed"
	// EventFail ends a session that failed with no restart left, or a
	// batch session past its max runtime.
	EventFail Event = "Fail"
	// EventHalt ends a session its agent stopped (on request, evicted
	// without re-queue, or a notebook that exited 0).
	EventHalt Event = "Halt"
	// EventBackOff releases a failed OnFailure session that will run
	// again after RetryAt.
	EventBackOff Event = "BackOff"
	// EventPreempt releases a preempted session that will run again.
	EventPreempt Event = "Preempt"
	// EventLostRequeue re-queues a session whose node was lost (placer).
	EventLostRequeue Event = "LostRequeue"
	// EventLose ends a session whose node was lost with no restart left.
	EventLose Event = "Lose"
	// EventLostStopped ends a session whose node was lost while it was
	// being stopped.
	EventLostStopped Event = "LostStopped"
	// EventFenced releases a session whose attempt was fenced on its node
	// (agent, reason Fenced) and that may restart: it waits to be
	// re-queued as the next attempt (lifecycle controller).
	EventFenced Event = "Fenced"
	// EventResize releases an elastic job its agents stopped to run again
	// at another size (eviction Resized): it waits to be re-queued at the
	// new size (lifecycle controller), as a preempted session does.
	EventResize Event = "Resize"
	// EventFencedLost ends a session whose attempt was fenced on its node
	// (agent, reason Fenced) with no restart left: Lost, as a node loss.
	EventFencedLost Event = "FencedLost"
)

// Facts are what a writer read before deciding, and what its transaction
// compares: the guards of the transition table are predicates over them.
type Facts struct {
	// Queued: pending/<id> exists (the txn compares its revision).
	Queued bool
	// Waiting: the status is a Pending one that waits to run again with
	// no queue entry (Status.Waiting; the txn compares the status).
	Waiting bool
	// Bound: the writer's binding exists at the create revision it was
	// given (the txn compares it).
	Bound bool
	// DesiredStopped: the spec's desired state is stopped, or the same
	// transaction sets it so (a stop); the txn compares the spec's
	// revision.
	DesiredStopped bool
	// RestartsLeft: the restart policy is OnFailure and restarts remain.
	RestartsLeft bool
	// Requeue: the spec carries an eviction that re-queues (preemption).
	Requeue bool
	// Resize: the spec carries an elastic job's resize (Session.Resizing).
	Resize bool
}

// Guard is a named predicate over Facts that a transition requires.
type Guard struct {
	Name string
	Test func(Facts) bool
}

func guard(name string, test func(Facts) bool) Guard { return Guard{Name: name, Test: test} }

var (
	always       = guard("always", func(Facts) bool { return true })
	queued       = guard("queued", func(f Facts) bool { return f.Queued })
	bound        = guard("bound", func(f Facts) bool { return f.Bound })
	stopAsked    = guard("queued or waiting, and stop asked", func(f Facts) bool { return (f.Queued || f.Waiting) && f.DesiredStopped })
	mayRequeue   = guard("waiting, not queued, not stopped", func(f Facts) bool { return f.Waiting && !f.Queued && !f.DesiredStopped })
	backOff      = guard("bound, restarts left, not stopped", func(f Facts) bool { return f.Bound && f.RestartsLeft && !f.DesiredStopped })
	preempt      = guard("bound, re-queueing eviction, not stopped", func(f Facts) bool { return f.Bound && f.Requeue && !f.DesiredStopped })
	lostRequeue  = guard("restarts left, not stopped, not queued", func(f Facts) bool { return f.RestartsLeft && !f.DesiredStopped && !f.Queued })
	lostNoRetry  = guard("not stopped", func(f Facts) bool { return !f.DesiredStopped })
	lostStopping = guard("stop asked", func(f Facts) bool { return f.DesiredStopped })
	resize       = guard("bound, resize eviction, not stopped", func(f Facts) bool { return f.Bound && f.Requeue && f.Resize && !f.DesiredStopped })
	fencedLost   = guard("bound, not stopped", func(f Facts) bool { return f.Bound && !f.DesiredStopped })
)

// live are the phases in which a binding exists and an agent owns the status.
var live = []Phase{PhaseBound, PhaseStarting, PhaseRunning, PhaseStopping}

// Transition is one row of the session state machine: Event moves a
// session in any of From to To when Guard holds. From holds "" for a
// session that does not exist yet.
type Transition struct {
	Event Event
	From  []Phase
	To    Phase
	Guard Guard
}

// Machine is the session state machine: every legal move of status/<id>'s
// phase. docs/architecture.md draws it. A phase and an event select at most
// one row.
var Machine = []Transition{
	{EventSubmit, []Phase{""}, PhasePending, always},
	{EventExplain, []Phase{PhasePending}, PhasePending, queued},
	{EventBind, []Phase{PhasePending}, PhaseBound, queued},
	{EventCancel, []Phase{PhasePending}, PhaseStopped, stopAsked},
	{EventRequeue, []Phase{PhasePending}, PhasePending, mayRequeue},
	{EventCreate, []Phase{PhaseBound, PhaseStarting}, PhaseStarting, bound},
	{EventStart, []Phase{PhaseBound, PhaseStarting, PhaseRunning}, PhaseRunning, bound},
	{EventObserve, []Phase{PhaseStarting, PhaseRunning, PhaseStopping}, "", bound}, // To "": the same phase
	{EventStop, live, PhaseStopping, bound},
	{EventSucceed, live, PhaseSucceeded, bound},
	{EventFail, live, PhaseFailed, bound},
	{EventHalt, live, PhaseStopped, bound},
	{EventBackOff, live, PhasePending, backOff},
	{EventPreempt, live, PhasePending, preempt},
	{EventResize, live, PhasePending, resize},
	{EventLostRequeue, live, PhasePending, lostRequeue},
	{EventLose, live, PhaseLost, lostNoRetry},
	{EventLostStopped, live, PhaseStopped, lostStopping},
	{EventFenced, live, PhasePending, backOff},
	{EventFencedLost, live, PhaseLost, fencedLost},
}

// ErrIllegalTransition means an event does not apply to a session in its
// phase, or its guard does not hold: nothing is written.
var ErrIllegalTransition = errors.New("illegal transition")

// Next returns the phase that ev moves a session in phase from to, given
// what the writer read. It returns ErrIllegalTransition, naming the phase,
// the event and the failed guard, when no row applies.
func Next(from Phase, ev Event, f Facts) (Phase, error) {
	for _, t := range Machine {
		if t.Event != ev || !slices.Contains(t.From, from) {
			continue
		}
		if !t.Guard.Test(f) {
			return "", fmt.Errorf("%s in phase %s: guard %q does not hold: %w", ev, phaseName(from), t.Guard.Name, ErrIllegalTransition)
		}
		if t.To == "" {
			return from, nil
		}
		return t.To, nil
	}
	return "", fmt.Errorf("%s does not apply in phase %s: %w", ev, phaseName(from), ErrIllegalTransition)
}

// Edge reports whether some event moves a session from phase from to phase
// to, and names them. The history checker uses it: a history shows phases,
// not events. to "" is the status's deletion, legal only once the session
// ended (retention).
func Edge(from, to Phase) (bool, []Event) {
	if to == "" {
		return from.Terminal(), nil
	}
	var evs []Event
	for _, t := range Machine {
		dst := t.To
		if dst == "" {
			dst = from
		}
		if dst == to && slices.Contains(t.From, from) {
			evs = append(evs, t.Event)
		}
	}
	return len(evs) > 0, evs
}

// EventOf names the event of a session that a release ends in phase p with
// reason: the agent's final status.
func EventOf(p Phase, reason string) (Event, error) {
	switch p {
	case PhaseSucceeded:
		return EventSucceed, nil
	case PhaseFailed:
		return EventFail, nil
	case PhaseStopped:
		return EventHalt, nil
	case PhasePending:
		switch reason {
		case ReasonBackOff:
			return EventBackOff, nil
		case ReasonPreempted:
			return EventPreempt, nil
		case ReasonFenced:
			return EventFenced, nil
		case ReasonResized:
			return EventResize, nil
		}
	case PhaseLost:
		if reason == ReasonFenced {
			return EventFencedLost, nil
		}
	}
	return "", fmt.Errorf("no release event ends in phase %s with reason %q: %w", phaseName(p), reason, ErrIllegalTransition)
}

func phaseName(p Phase) string {
	if p == "" {
		return "(none)"
	}
	return string(p)
}

// Phases lists every phase, in the order docs/architecture.md draws them.
func Phases() []Phase {
	return []Phase{PhasePending, PhaseBound, PhaseStarting, PhaseRunning, PhaseStopping,
		PhaseSucceeded, PhaseFailed, PhaseStopped, PhaseLost}
}

// MachineTable renders Machine as a Markdown table (event, from, to,
// guard): docs/architecture.md carries it, and a test keeps the two equal.
func MachineTable() string {
	var b strings.Builder
	b.WriteString("| event | from | to | guard |\n|---|---|---|---|\n")
	for _, t := range Machine {
		from := make([]string, len(t.From))
		for i, p := range t.From {
			from[i] = phaseName(p)
		}
		to := phaseName(t.To)
		if t.To == "" {
			to = "(same)"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", t.Event, strings.Join(from, ", "), to, t.Guard.Name)
	}
	return b.String()
}
