package api

import (
	"fmt"
	"sync"
	"time"

	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// queuedIndex counts each owner's queued sessions for the per-user cap
// (MaxQueuedPerUser) from the pending cache's events, so a create counts
// nothing in etcd. The creates this API admitted and the cache has not shown
// yet are reservations, counted too: one API replica caps a user exactly,
// concurrent creates included; several replicas can each let one create
// through before their caches show the others'.
type queuedIndex struct {
	mu     sync.Mutex
	counts map[string]int
	// reserved are the sessions admitted and not yet seen in pending/, by
	// id: their owner and when they were admitted.
	reserved map[string]reservation
}

type reservation struct {
	owner string
	at    time.Time
}

// reservationTTL drops a reservation whose pending key the cache never
// showed (a relist after compaction saw only its net absence).
const reservationTTL = time.Minute

func newQueuedIndex() *queuedIndex {
	return &queuedIndex{counts: map[string]int{}, reserved: map[string]reservation{}}
}

// apply keeps the counts in step with one change of pending/.
func (x *queuedIndex) apply(k state.Keys, ev watcher.Event[state.QueueEntry]) {
	x.mu.Lock()
	defer x.mu.Unlock()
	switch ev.Type {
	case watcher.Added:
		x.counts[ev.Value.Owner]++
		if id, ok := k.SessionID(ev.Key); ok {
			delete(x.reserved, id)
		}
	case watcher.Modified:
		if ev.Prev != nil && ev.Prev.Owner != ev.Value.Owner {
			x.add(ev.Prev.Owner, -1)
			x.counts[ev.Value.Owner]++
		}
	case watcher.Deleted:
		x.add(ev.Value.Owner, -1)
	}
}

func (x *queuedIndex) add(owner string, d int) {
	if x.counts[owner] += d; x.counts[owner] <= 0 {
		delete(x.counts, owner)
	}
}

// check explains why owner may not add adding sessions to the queue, or
// returns nil (max 0: no cap). A job array adds as many as it may hold
// unfinished at once; its controller creates them later, so nothing is
// reserved for them.
func (x *queuedIndex) check(owner string, max, adding int, now time.Time) []FieldError {
	if max <= 0 {
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.over(owner, max, adding, now)
}

// over is check with x.mu held.
func (x *queuedIndex) over(owner string, max, adding int, now time.Time) []FieldError {
	n := x.counts[owner]
	for rid, r := range x.reserved {
		switch {
		case now.Sub(r.at) > reservationTTL:
			delete(x.reserved, rid)
		case r.owner == owner:
			n++
		}
	}
	if n+adding <= max {
		return nil
	}
	if adding > 1 {
		return []FieldError{{Field: "maxRunning", Message: fmt.Sprintf("you have %d sessions queued and this array may queue %d at once; the most allowed per user is %d: lower maxRunning to %d or less, or wait for some to start", n, adding, max, max-n)}}
	}
	return []FieldError{{Field: "", Message: fmt.Sprintf("you have %d sessions queued, the most allowed per user is %d; wait for some to start, or cancel some", n, max)}}
}

// admit reserves a place in the queue for session id of owner, or explains
// why owner has no place left (max 0: no cap).
func (x *queuedIndex) admit(owner, id string, max int, now time.Time) []FieldError {
	if max <= 0 {
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if errs := x.over(owner, max, 1, now); errs != nil {
		return errs
	}
	x.reserved[id] = reservation{owner: owner, at: now}
	return nil
}

// release drops id's reservation: its create failed, or created nothing.
func (x *queuedIndex) release(id string) {
	x.mu.Lock()
	delete(x.reserved, id)
	x.mu.Unlock()
}
