package state

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Sentinel errors of the transactions in this package.
var (
	// ErrExists means a record that must be new already exists.
	ErrExists = errors.New("already exists")
	// ErrNotFound means a record that must exist does not.
	ErrNotFound = errors.New("not found")
	// ErrConflict means a record changed between read and write; the caller
	// re-reads and tries again.
	ErrConflict = errors.New("changed concurrently")
)

// NewQueueEntry derives the queue entry of a session spec.
func NewQueueEntry(s Session, now time.Time) QueueEntry {
	q := QueueEntry{
		Session:     s.ID,
		Kind:        s.Kind,
		Owner:       s.Owner,
		Groups:      s.Groups,
		Team:        s.Team,
		Priority:    s.Priority,
		Preemptible: s.Preemptible,
		Created:     s.Created,
		Enqueued:    now,
		Request:     s.Resources,
		MaxRuntime:  s.Limits.MaxRuntime,
	}
	if s.Ray != nil {
		q.Workers = s.Ray.Workers
		q.WorkerRequest = s.Ray.WorkerResources
	}
	if s.Gang() {
		// Ranks 1 to Nodes-1 are the gang's workers, each part with the
		// session's resources.
		q.Nodes, q.Workers, q.WorkerRequest = s.Nodes, s.Nodes-1, nil
	}
	if s.Elastic != nil {
		el := *s.Elastic
		q.Elastic = &el
		if s.Gang() && el.ByNodes() {
			// A range of machines asks for its cap; the placer may bind
			// fewer parts, down to MinNodes (placer/elastic_nodes.go).
			q.Workers = el.NodeCap() - 1
		}
	}
	q.Secrets = NeedsSecrets(s)
	return q
}

// CreateSession writes a new session in one transaction: its spec, its queue
// entry and a Pending status. It fails with ErrExists, writing nothing, if
// the id is taken, and with ErrConflict if a guard fails (the records the
// spec was built from, such as its volumes' definitions, changed since
// they were read). It returns the revision of the write.
func CreateSession(ctx context.Context, kv clientv3.KV, k Keys, s Session, now time.Time, guards ...clientv3.Cmp) (int64, error) {
	if err := ValidateName("session id", s.ID); err != nil {
		return 0, fmt.Errorf("create session: %w", err)
	}
	s, ray, err := secretOps(k, s)
	if err != nil {
		return 0, fmt.Errorf("create session: %w", err)
	}
	spec, entry, st, err := encodeNew(s, now)
	if err != nil {
		return 0, fmt.Errorf("create session: %w", err)
	}
	resp, err := kv.Txn(ctx).
		If(append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k.Session(s.ID)), "=", 0)}, guards...)...).
		Then(append(createOps(k, s.ID, spec, entry, st), ray...)...).
		Else(clientv3.OpGet(k.Session(s.ID), clientv3.WithCountOnly())).Commit()
	if err != nil {
		return 0, fmt.Errorf("create session %s: %w", s.ID, err)
	}
	if !resp.Succeeded {
		if resp.Responses[0].GetResponseRange().Count == 0 {
			return 0, fmt.Errorf("create session %s: %w", s.ID, ErrConflict)
		}
		return 0, fmt.Errorf("create session %s: %w", s.ID, ErrExists)
	}
	return resp.Header.Revision, nil
}

// Get reads and decodes one key. It returns ErrNotFound if the key is absent,
// and the value's mod revision for use in a later conditional write.
func Get[T any](ctx context.Context, kv clientv3.KV, key string) (T, int64, error) {
	var zero T
	resp, err := kv.Get(ctx, key)
	if err != nil {
		return zero, 0, fmt.Errorf("get %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return zero, 0, fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	v, err := Decode[T](resp.Kvs[0].Value)
	if err != nil {
		return zero, 0, fmt.Errorf("get %s: %w", key, err)
	}
	return v, resp.Kvs[0].ModRevision, nil
}

// Put encodes v and writes it to key unconditionally: for admin records
// (cordons, quotas, profiles) whose last writer wins.
func Put(ctx context.Context, kv clientv3.KV, key string, v any) (int64, error) {
	s, err := Encode(v)
	if err != nil {
		return 0, fmt.Errorf("put %s: %w", key, err)
	}
	resp, err := kv.Put(ctx, key, s)
	if err != nil {
		return 0, fmt.Errorf("put %s: %w", key, err)
	}
	return resp.Header.Revision, nil
}

// NewStatus is the status a session starts with (EventSubmit): Pending,
// waiting for the placer.
func NewStatus(s Session, now time.Time) Status {
	phase, _ := Next("", EventSubmit, Facts{}) // Submit has no guard: Pending
	return Status{
		Session: s.ID,
		Phase:   phase,
		Reason:  "Queued",
		Message: "waiting for the placer",
		Created: s.Created,
		Updated: now,
	}
}

func encodeNew(s Session, now time.Time) (spec, entry, st string, err error) {
	if spec, err = Encode(s); err != nil {
		return "", "", "", err
	}
	if entry, err = Encode(NewQueueEntry(s, now)); err != nil {
		return "", "", "", err
	}
	if st, err = Encode(NewStatus(s, now)); err != nil {
		return "", "", "", err
	}
	return spec, entry, st, nil
}

func createOps(k Keys, id, spec, entry, st string) []clientv3.Op {
	return []clientv3.Op{
		clientv3.OpPut(k.Session(id), spec),
		clientv3.OpPut(k.Pending(id), entry),
		clientv3.OpPut(k.Status(id), st),
	}
}
