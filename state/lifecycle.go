package state

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// IdempotencyRecord remembers what a create request with an
// Idempotency-Key made, stored at idempotency/<owner>/<digest> under a
// lease, so the record expires by itself. One key space serves session and
// array creates: exactly one of Session and Array is set, so a key sent
// first with one and then with the other is refused as reused.
type IdempotencyRecord struct {
	// Session is the id of the session the first request created.
	Session string `json:"session,omitempty"`
	// Array is the id of the job array the first request created
	// (POST /api/v1/arrays).
	Array string `json:"array,omitempty"`
	// RequestHash is a digest of the first request's body: a repeat with a
	// different body is refused rather than answered with the old session.
	RequestHash string    `json:"requestHash"`
	Created     time.Time `json:"created"`
}

// Idempotency is the record a create writes with what it creates: rec at
// Key under Lease, on condition that Key does not exist yet.
type Idempotency struct {
	Key    string
	Record IdempotencyRecord
	Lease  clientv3.LeaseID
}

// CreateSessionIdempotent is CreateSession that also writes idem's record,
// in the same transaction and only if its key does not exist yet. When it
// exists, nothing is written and the stored record is returned with
// created false: the caller answers the repeat with it. guards are
// compared as by CreateSession (ErrConflict when one fails).
func CreateSessionIdempotent(ctx context.Context, kv clientv3.KV, k Keys, s Session, now time.Time, idem Idempotency, guards ...clientv3.Cmp) (stored IdempotencyRecord, created bool, err error) {
	if err := ValidateName("session id", s.ID); err != nil {
		return IdempotencyRecord{}, false, fmt.Errorf("create session: %w", err)
	}
	s, ray, err := secretOps(k, s)
	if err != nil {
		return IdempotencyRecord{}, false, fmt.Errorf("create session: %w", err)
	}
	spec, entry, st, err := encodeNew(s, now)
	if err != nil {
		return IdempotencyRecord{}, false, fmt.Errorf("create session: %w", err)
	}
	stored, created, err = createIdempotent(ctx, kv, k.Session(s.ID), append(createOps(k, s.ID, spec, entry, st), ray...), idem, guards)
	if err != nil {
		return IdempotencyRecord{}, false, fmt.Errorf("create session %s: %w", s.ID, err)
	}
	return stored, created, nil
}

// createIdempotent commits ops, which create key, with idem's record, on
// condition that neither key nor idem.Key exists and every guard holds.
// When idem.Key exists it returns the stored record and created false;
// otherwise ErrExists when key was taken, ErrConflict when a guard failed.
func createIdempotent(ctx context.Context, kv clientv3.KV, key string, ops []clientv3.Op, idem Idempotency, guards []clientv3.Cmp) (IdempotencyRecord, bool, error) {
	r, err := Encode(idem.Record)
	if err != nil {
		return IdempotencyRecord{}, false, err
	}
	resp, err := kv.Txn(ctx).
		If(append([]clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(idem.Key), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(key), "=", 0),
		}, guards...)...).
		Then(append(ops, clientv3.OpPut(idem.Key, r, clientv3.WithLease(idem.Lease)))...).
		Else(clientv3.OpGet(idem.Key), clientv3.OpGet(key, clientv3.WithCountOnly())).Commit()
	if err != nil {
		return IdempotencyRecord{}, false, err
	}
	if resp.Succeeded {
		return idem.Record, true, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		if resp.Responses[1].GetResponseRange().Count == 0 { // a guard failed
			return IdempotencyRecord{}, false, ErrConflict
		}
		return IdempotencyRecord{}, false, ErrExists // the id was taken, not the key
	}
	old, err := Decode[IdempotencyRecord](kvs[0].Value)
	if err != nil {
		return IdempotencyRecord{}, false, err
	}
	return old, false, nil
}

// StopOutcome says what StopSession did.
type StopOutcome string

// Stop outcomes.
const (
	// StopCancelled: the session was pending; its queue entry is gone and
	// its status is Stopped.
	StopCancelled StopOutcome = "cancelled"
	// StopRequested: the session was bound or running; its desired state is
	// now stopped and its agent will stop it.
	StopRequested StopOutcome = "stopping"
	// StopAlready: the session had already ended or was already asked to
	// stop; nothing was written.
	StopAlready StopOutcome = "unchanged"
)

// maxStopAttempts bounds StopSession's read-modify-write retries.
const maxStopAttempts = 16

// StopSession asks session id to stop. A pending session is cancelled in
// one transaction (EventCancel): its queue entry is deleted, its desired
// state set to stopped and its status set to Stopped, on condition that
// neither the spec nor the queue entry changed since read, so a placer
// binding it at the same moment either wins (and the stop becomes a
// desired-state change) or loses (its bind transaction finds the entry
// gone). A bound or running session gets desired=stopped; its agent stops
// the containers. A session waiting to run again (Status.Waiting: back-off
// or preempted) has neither a queue entry nor an agent, so its status
// becomes Stopped (EventCancel) in the same transaction as the spec, on
// condition that the status is unchanged — also when its desired state is
// already stopped, which happens when the stop landed while its agent was
// releasing it: a repeated stop ends it rather than leaving it waiting
// forever. by names who asked, for the status message. It returns
// ErrNotFound for an unknown id.
func StopSession(ctx context.Context, kv clientv3.KV, k Keys, id, by string, now time.Time) (StopOutcome, error) {
	for attempt := 0; attempt < maxStopAttempts; attempt++ {
		resp, err := kv.Txn(ctx).Then(
			clientv3.OpGet(k.Session(id)),
			clientv3.OpGet(k.Pending(id)),
			clientv3.OpGet(k.Status(id)),
		).Commit()
		if err != nil {
			return "", fmt.Errorf("stop session %s: %w", id, err)
		}
		specKVs := resp.Responses[0].GetResponseRange().Kvs
		pendKVs := resp.Responses[1].GetResponseRange().Kvs
		statKVs := resp.Responses[2].GetResponseRange().Kvs
		if len(specKVs) == 0 {
			return "", fmt.Errorf("stop session %s: %w", id, ErrNotFound)
		}
		s, err := Decode[Session](specKVs[0].Value)
		if err != nil {
			return "", fmt.Errorf("stop session %s: %w", id, err)
		}
		var st Status
		var statRev int64
		if len(statKVs) > 0 {
			if st, err = Decode[Status](statKVs[0].Value); err != nil {
				return "", fmt.Errorf("stop session %s: %w", id, err)
			}
			statRev = statKVs[0].ModRevision
		}
		queued, waiting := len(pendKVs) > 0, st.Waiting()
		if st.Phase.Terminal() || (s.Desired == DesiredStopped && !queued && !waiting) {
			return StopAlready, nil
		}
		s.Desired = DesiredStopped
		spec, err := Encode(s)
		if err != nil {
			return "", fmt.Errorf("stop session %s: %w", id, err)
		}
		cmps := []clientv3.Cmp{
			clientv3.Compare(clientv3.ModRevision(k.Session(id)), "=", specKVs[0].ModRevision),
			clientv3.Compare(clientv3.ModRevision(k.Pending(id)), "=", modRevOf(pendKVs)),
		}
		ops := []clientv3.Op{clientv3.OpPut(k.Session(id), spec)}
		if queued || waiting {
			// No agent holds it: the stop ends it here.
			next, err := Next(st.Phase, EventCancel, Facts{Queued: queued, Waiting: waiting, DesiredStopped: true})
			if err != nil {
				return "", fmt.Errorf("stop session %s: %w", id, err)
			}
			fin := now.UTC()
			st.Session, st.Phase, st.Reason = id, next, "Cancelled"
			st.Message = "cancelled while pending by " + by
			if waiting {
				st.Message = "cancelled while waiting to restart by " + by
			}
			st.QueuePosition, st.RetryAt, st.Updated, st.Finished = 0, nil, fin, &fin
			if st.Created.IsZero() {
				st.Created = s.Created
			}
			sv, err := Encode(st)
			if err != nil {
				return "", fmt.Errorf("stop session %s: %w", id, err)
			}
			ops = append(ops, clientv3.OpPut(k.Status(id), sv))
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k.Status(id)), "=", statRev))
			if queued {
				ops = append(ops, clientv3.OpDelete(k.Pending(id)))
			}
		}
		r, err := kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return "", fmt.Errorf("stop session %s: %w", id, err)
		}
		if r.Succeeded {
			if queued || waiting {
				return StopCancelled, nil
			}
			return StopRequested, nil
		}
	}
	return "", fmt.Errorf("stop session %s: %w after %d attempts", id, ErrConflict, maxStopAttempts)
}

func modRevOf(kvs []*mvccpb.KeyValue) int64 {
	if len(kvs) == 0 {
		return 0
	}
	return kvs[0].ModRevision
}

// Waiting reports whether the session waits to run again with no queue
// entry: failed under OnFailure (BackOff), preempted, or fenced with
// restarts left (Fenced), until RetryAt.
func (st Status) Waiting() bool {
	return st.Phase == PhasePending && st.RetryAt != nil && (st.Reason == ReasonBackOff || st.Reason == ReasonPreempted || st.Reason == ReasonFenced || st.Reason == ReasonResized)
}

// Requeue puts a waiting session back in the queue in one transaction: its
// queue entry (attempt as given), a Pending status and, when the spec
// carried an eviction, the spec without it. It applies only if the spec
// and the status are at the revisions read and no queue entry exists, so a
// stop racing it wins or loses whole. It returns false, writing nothing,
// when something changed, and an error wrapping ErrIllegalTransition when
// the state machine refuses EventRequeue (the session is not waiting, or
// its owner asked it to stop).
func Requeue(ctx context.Context, kv clientv3.KV, k Keys, s Session, specRev int64, st Status, statusRev int64, attempt int, msg string, now time.Time) (bool, error) {
	now = now.UTC()
	next, err := Next(st.Phase, EventRequeue, Facts{Waiting: st.Waiting(), DesiredStopped: s.Desired == DesiredStopped})
	if err != nil {
		return false, fmt.Errorf("requeue session %s: %w", s.ID, err)
	}
	e := NewQueueEntry(s, now)
	e.Attempt = attempt
	s.Eviction = nil
	st.Phase, st.Reason, st.Message = next, "Queued", msg
	st.Attempt, st.RetryAt, st.Updated = attempt, nil, now
	st.Nodes, st.URLs, st.Bound, st.Started, st.Finished, st.Activity = nil, nil, nil, nil, nil, nil
	spec, err := Encode(s)
	if err != nil {
		return false, fmt.Errorf("requeue session %s: %w", s.ID, err)
	}
	ev, err := Encode(e)
	if err != nil {
		return false, fmt.Errorf("requeue session %s: %w", s.ID, err)
	}
	sv, err := Encode(st)
	if err != nil {
		return false, fmt.Errorf("requeue session %s: %w", s.ID, err)
	}
	r, err := kv.Txn(ctx).If(
		clientv3.Compare(clientv3.ModRevision(k.Session(s.ID)), "=", specRev),
		clientv3.Compare(clientv3.ModRevision(k.Status(s.ID)), "=", statusRev),
		clientv3.Compare(clientv3.CreateRevision(k.Pending(s.ID)), "=", 0),
	).Then(
		clientv3.OpPut(k.Session(s.ID), spec),
		clientv3.OpPut(k.Pending(s.ID), ev),
		clientv3.OpPut(k.Status(s.ID), sv),
	).Commit()
	if err != nil {
		return false, fmt.Errorf("requeue session %s: %w", s.ID, err)
	}
	return r.Succeeded, nil
}
