package state

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// PartStatus is what one node's agent observed of its part of a session,
// stored at parts/<node>/<id>. The agent writes only its own node's parts
// (its etcd role cannot write status/); the placers' status merger folds
// the parts of a session into status/<id> with MergeParts. A part lives
// from the agent's first report until the merger has folded its end into
// the status (or found it stale: another queueing's, or of a session that
// is gone).
type PartStatus struct {
	Session string `json:"session"`
	Node    string `json:"node"`
	Role    Role   `json:"role"`
	// Rank is the part's place in its gang: 0 for the head (or single)
	// part, the binding's Worker index for a worker.
	Rank int `json:"rank,omitempty"`
	// Phase is Starting, Running or Stopping while the part's binding
	// exists; once its agent released the binding, how the part ended:
	// Succeeded, Failed, Stopped, or Pending (it waits to run again:
	// Reason BackOff or Preempted, RetryAt set).
	Phase    Phase  `json:"phase"`
	Reason   string `json:"reason,omitempty"`
	Message  string `json:"message,omitempty"`
	ExitCode *int   `json:"exitCode,omitempty"`
	// Attempt, QueueRevision and BindingRevision name the binding this
	// part serves: its attempt, the queue entry it consumed, and its
	// create revision.
	Attempt         int   `json:"attempt,omitempty"`
	QueueRevision   int64 `json:"queueRevision"`
	BindingRevision int64 `json:"bindingRevision"`
	// URLs are the part's URLs without their secret parts (those go to
	// secrets/<node>/<id>, SplitSecrets).
	URLs map[string]string `json:"urls,omitempty"`
	// Address is the part's container's own address, when it has one
	// (an isolated network), reported before its process starts: the
	// other parts of a multi-node job reach it there.
	Address  string     `json:"address,omitempty"`
	Started  *time.Time `json:"started,omitempty"`
	Finished *time.Time `json:"finished,omitempty"`
	RetryAt  *time.Time `json:"retryAt,omitempty"`
	// Launched is when the part's agent recorded (Launch) that it starts
	// the binding's container: set once per binding, before the container
	// is created. An agent that finds it set and the container gone never
	// starts the binding again: the attempt ended (ReasonFenced).
	Launched *time.Time `json:"launched,omitempty"`
	// Activity is the head (or single) part's activity sample.
	Activity *Activity `json:"activity,omitempty"`
	Updated  time.Time `json:"updated"`
}

// NewPartStatus is the part of binding b (created at bindingRev) before
// its agent reported anything: phase Bound.
func NewPartStatus(b Binding, bindingRev int64) PartStatus {
	return PartStatus{
		Session: b.Session, Node: b.Node, Role: b.Role, Rank: b.Worker, Phase: PhaseBound,
		Attempt: b.Attempt, QueueRevision: b.QueueRevision, BindingRevision: bindingRev,
	}
}

// Ended reports whether the part's agent released its binding: the part
// says how it ended.
func (p PartStatus) Ended() bool { return p.Phase.Terminal() || p.Phase == PhasePending }

// failure reports whether an ended part failed: Failed, fenced (Lost, or
// waiting to run again as the next attempt), or waiting to restart after
// a failure (BackOff).
func (p PartStatus) failure() bool {
	return p.Phase == PhaseFailed || p.Phase == PhaseLost ||
		(p.Phase == PhasePending && (p.Reason == ReasonBackOff || p.Reason == ReasonFenced))
}

// PartOps are the puts that write part p as its node's agent reports it:
// the part without secrets, and, when its URLs carry any, secrets/<node>/<id>
// with the full URLs (SplitSecrets). The agent writes parts only through
// them, so no token reaches parts/ (or, through the merger, status/).
func PartOps(k Keys, p PartStatus) ([]clientv3.Op, error) {
	public, secret := SplitSecrets(Status{URLs: p.URLs})
	p.URLs = public.URLs
	v, err := Encode(p)
	if err != nil {
		return nil, fmt.Errorf("encode part: %w", err)
	}
	ops := []clientv3.Op{clientv3.OpPut(k.Part(p.Node, p.Session), v)}
	if secret != nil {
		sv, err := Encode(Secrets{Session: p.Session, Node: p.Node, URLs: secret})
		if err != nil {
			return nil, fmt.Errorf("encode secrets: %w", err)
		}
		ops = append(ops, clientv3.OpPut(k.Secret(p.Node, p.Session), sv))
	}
	return ops, nil
}

// Current reports whether part p belongs to the queueing that status st
// is bound to: its node is one of the status's and its queue revision is
// the status's (a status from before part keys, QueueRevision 0, takes
// any part of its nodes).
func (st Status) Current(p PartStatus) bool {
	return slices.Contains(st.Nodes, p.Node) && (st.QueueRevision == 0 || p.QueueRevision == st.QueueRevision)
}

// Gang reports whether the session is a multi-node batch job (Nodes > 1),
// whose parts decide its status together (MergeParts); otherwise its
// head (or single) part alone decides.
func (s Session) Gang() bool { return s.Kind == KindBatch && s.Nodes > 1 }

// StopsAll reports whether a failed part ends a multi-node job
// (OnPartFailure StopAll, the default).
func (s Session) StopsAll() bool { return s.OnPartFailure != PartFailureContinue }

// MergeParts decides the status of a bound session from the parts its
// agents reported, and the event that moves it there: the one rule by
// which parts become a session's status. spec and cur are the spec and
// status read with the parts (the caller's transaction compares all
// three); parts are the current ones (Status.Current), in any order. It
// returns changed false when the status already says what the parts say
// or cur is not live (nothing to merge into).
//
// The rule:
//   - A notebook, a Ray session or a batch job on one node: the head (or
//     single) part decides; Ray workers' parts never change the status.
//   - A multi-node batch job (Session.Gang): Starting until every part
//     runs, then Running (Started is the last part's start); Stopping as
//     soon as any part stops. It ends when rank 0 ends, or, with
//     OnPartFailure StopAll (the default), when any part fails (Failed,
//     or BackOff to restart): the first failure (by its report's time,
//     then rank) gives the outcome and exit code, else rank 0 does. With
//     Continue only rank 0's end ends the job, with rank 0's outcome. The
//     job's end stops its other parts: their agents watch the status.
//
// A part that ended waiting to run again (BackOff, Preempted, Fenced), or
// fenced with no restart left (Lost, Fenced), whose event the state machine
// refuses because its owner asked to stop meanwhile, ends the session
// Stopped (StopRequested): a stop is never undone by a restart, and a
// fence during a stop still ends the session. A restart refused for want of restarts ends it
// Failed (Lost after a fence).
func MergeParts(spec Session, cur Status, parts []PartStatus, now time.Time) (Event, Status, bool, error) {
	if !slices.Contains(live, cur.Phase) {
		return "", cur, false, nil
	}
	spec.Nodes = spec.JobNodes(cur) // a range of machines: the parts of this attempt
	v, ok := decidingPart(spec, parts)
	if !ok {
		return "", cur, false, nil
	}
	ev, err := partEvent(cur.Phase, v)
	if err != nil {
		return "", cur, false, err
	}
	f := Facts{Bound: true, DesiredStopped: spec.Desired == DesiredStopped,
		RestartsLeft: spec.RestartsLeft(cur.Attempt), Requeue: spec.Eviction != nil && spec.Eviction.Requeue, Resize: spec.Resizing()}
	next, err := Next(cur.Phase, ev, f)
	if err != nil && (ev == EventBackOff || ev == EventPreempt || ev == EventFenced || ev == EventFencedLost || ev == EventResize) && errors.Is(err, ErrIllegalTransition) {
		// The part's agent decided to restart (or, fenced with no
		// restart left, to end Lost) from an older spec.
		v.RetryAt, v.Finished = nil, cmp.Or(v.Finished, &now)
		switch {
		case f.DesiredStopped && (ev == EventFenced || ev == EventFencedLost):
			// A stop asked while the node was fenced: the containers are
			// gone, and the stop stands; the message keeps the fence.
			v.Phase, v.Reason, v.Message, ev = PhaseStopped, "StopRequested", "stopped on request; "+v.Message, EventHalt
		case f.DesiredStopped || ev == EventPreempt || ev == EventResize:
			v.Phase, v.Reason, v.Message, ev = PhaseStopped, "StopRequested", "stopped on request", EventHalt
		case ev == EventFenced:
			v.Phase, ev = PhaseLost, EventFencedLost
		default:
			v.Phase, ev = PhaseFailed, EventFail
		}
		next, err = Next(cur.Phase, ev, f)
	}
	if err != nil {
		return "", cur, false, err
	}
	st := cur
	st.Phase = next
	st.Reason, st.Message = v.Reason, v.Message
	st.ExitCode, st.Started, st.Activity = v.ExitCode, v.Started, v.Activity
	st.Elastic = foldActivityGoodput(st.Elastic, v.Activity)
	st.URLs = nil
	if len(v.URLs) > 0 {
		st.URLs = maps.Clone(v.URLs)
	}
	st.Finished, st.RetryAt = nil, nil
	switch {
	case next == PhasePending:
		st.RetryAt, st.Activity = v.RetryAt, nil
		delete(st.URLs, "jupyter")
	case next.Terminal():
		st.Finished = cmp.Or(v.Finished, &now)
	}
	before, _ := Encode(cur)
	after, _ := Encode(st)
	if before == after {
		return "", cur, false, nil
	}
	st.Updated = now
	return ev, st, true, nil
}

// decidingPart returns the part view that decides the session's status
// (MergeParts' rule), and false when no part decides anything yet.
func decidingPart(spec Session, parts []PartStatus) (PartStatus, bool) {
	if !spec.Gang() {
		for _, p := range parts {
			if p.Role != RoleWorker && p.Phase != PhaseBound {
				return p, true
			}
		}
		return PartStatus{}, false
	}
	ps := slices.Clone(parts)
	slices.SortFunc(ps, func(a, b PartStatus) int { return cmp.Compare(a.Rank, b.Rank) })
	var head *PartStatus
	for i := range ps {
		if ps[i].Rank == 0 {
			head = &ps[i]
		}
	}
	if spec.StopsAll() {
		var first *PartStatus
		for i := range ps {
			p := &ps[i]
			if p.failure() && (first == nil || p.Updated.Before(first.Updated)) {
				first = p
			}
		}
		if first != nil {
			v := *first
			if first.Rank != 0 {
				v.Message = fmt.Sprintf("part %d on %s: %s", first.Rank, first.Node, first.Message)
				if head != nil { // the job's URLs and activity are the head's
					v.URLs, v.Activity, v.Started = head.URLs, head.Activity, head.Started
				}
			}
			return v, true
		}
	}
	if head != nil && head.Ended() {
		return *head, true
	}
	// Live: Stopping if any part stops; Running once every part runs (or
	// already ended); else Starting.
	var started *time.Time
	running, stopping, reported := 0, (*PartStatus)(nil), 0
	for i := range ps {
		p := &ps[i]
		if p.Phase != PhaseBound {
			reported++
		}
		if p.Phase == PhaseStopping && stopping == nil {
			stopping = p
		}
		if p.Phase == PhaseRunning || (p.Ended() && p.Started != nil) {
			running++
			if p.Started != nil && (started == nil || p.Started.After(*started)) {
				started = p.Started
			}
		}
	}
	base := PartStatus{}
	if head != nil {
		base = *head
	}
	switch {
	case reported == 0:
		return PartStatus{}, false
	case stopping != nil:
		base.Phase, base.Reason, base.Message = PhaseStopping, stopping.Reason, stopping.Message
	case running == spec.Nodes && head != nil && head.Phase == PhaseRunning:
		base.Phase, base.Started = PhaseRunning, started
		base.Message = fmt.Sprintf("all %d parts running", spec.Nodes)
	default:
		base.Phase, base.Started, base.Activity = PhaseStarting, nil, nil
		base.Reason = "Starting"
		base.Message = fmt.Sprintf("%d of %d parts running", running, spec.Nodes)
	}
	base.ExitCode, base.Finished, base.RetryAt = nil, nil, nil
	return base, true
}

// partEvent names the event that moves a status in phase from to the
// phase of the deciding part v.
func partEvent(from Phase, v PartStatus) (Event, error) {
	if v.Phase == from && !v.Ended() {
		return EventObserve, nil
	}
	switch v.Phase {
	case PhaseStarting:
		return EventCreate, nil
	case PhaseRunning:
		return EventStart, nil
	case PhaseStopping:
		return EventStop, nil
	}
	return EventOf(v.Phase, v.Reason)
}
