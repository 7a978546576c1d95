package history

import (
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// Rules of GPU-hours accounting (state.Accrue), as Violation.Rule names
// them.
const (
	// RuleAccrualTwice: an attempt's accrual (accruals/<id>/<queueRevision>)
	// was written over an existing one, or created again after it was
	// deleted: its GPU-time counted twice.
	RuleAccrualTwice = "accrual-twice"
	// RuleAccrualMismatch: an accrual that does not match the attempt it
	// names: written while that attempt still holds its GPUs, with another
	// bound time than its status showed, or with GPU-time other than its
	// GPUs times its bound time.
	RuleAccrualMismatch = "accrual-mismatch"
	// RuleRetiredUnaccrued: a session's status was deleted (retired)
	// while it showed a bound attempt that ended (state.EndedStatus)
	// whose accrual did not exist: the usage accountant can no longer
	// count it (state.Accrue requires the status), so its GPU-hours are
	// lost. Retention waits for the accrual (lifecycle.Retention's
	// AccrualWait); only a stopped accountant makes it give up.
	RuleRetiredUnaccrued = "retired-unaccrued"
)

// accruals is the model of the accounting rules.
type accruals struct {
	// created are the accrual keys created in the checked history.
	created map[string]bool
	// live are the accrual keys that exist now (listed or created, not
	// deleted since).
	live map[string]bool
	// bound is each attempt's bound time as its status showed it, by
	// session id and queue revision.
	bound map[attemptKey]time.Time
}

type attemptKey struct {
	id string
	qr int64
}

// noteAttempt records the bound time of the attempt a status shows.
func (c *Checker) noteAttempt(id string, st state.Status) {
	if st.Bound == nil || st.QueueRevision <= 0 {
		return
	}
	if c.acct.bound == nil {
		c.acct.bound = map[attemptKey]time.Time{}
	}
	c.acct.bound[attemptKey{id, st.QueueRevision}] = *st.Bound
}

// checkAccrual applies one change of an accrual key.
func (c *Checker) checkAccrual(ch Change, transitions bool, bad func(key, rule, format string, args ...any)) {
	id, qr, ok := c.k.AccrualKey(ch.Key)
	if !ok {
		return
	}
	if c.acct.live == nil {
		c.acct.live = map[string]bool{}
	}
	if ch.Value == nil {
		delete(c.acct.live, ch.Key)
	} else {
		c.acct.live[ch.Key] = true
	}
	if ch.Value == nil || !transitions {
		return // marks of retired sessions are deleted at will
	}
	if c.acct.created == nil {
		c.acct.created = map[string]bool{}
	}
	switch {
	case ch.Prev != nil || ch.Version > 1:
		bad(ch.Key, RuleAccrualTwice, "the accrual of %s's attempt of queue revision %d was written again over the first", id, qr)
	case c.acct.created[ch.Key]:
		bad(ch.Key, RuleAccrualTwice, "the accrual of %s's attempt of queue revision %d was created again after it was deleted", id, qr)
	}
	c.acct.created[ch.Key] = true
	a, err := state.Decode[state.Accrual](ch.Value)
	if err != nil {
		bad(ch.Key, RuleUndecodable, "%v", err)
		return
	}
	if st, ok := c.statuses[id]; ok && state.BoundPhase(st.Phase) && st.QueueRevision == qr {
		bad(ch.Key, RuleAccrualMismatch, "accrued while the attempt still holds its GPUs (%s)", st.Phase)
	}
	if b, ok := c.acct.bound[attemptKey{id, qr}]; ok && !b.Equal(a.Bound) {
		bad(ch.Key, RuleAccrualMismatch, "bound at %s, but its status said %s", a.Bound.Format(time.RFC3339Nano), b.Format(time.RFC3339Nano))
	}
	if a.Session != id || a.QueueRevision != qr {
		bad(ch.Key, RuleAccrualMismatch, "the record names session %s, queue revision %d", a.Session, a.QueueRevision)
	}
	if want := state.GPUMillis(a.GPUs, a.Bound, a.Ended); a.GPUMilliseconds != want {
		bad(ch.Key, RuleAccrualMismatch, "%d GPU-milliseconds recorded for %d GPUs from %s to %s, which make %d", a.GPUMilliseconds, a.GPUs,
			a.Bound.Format(time.RFC3339Nano), a.Ended.Format(time.RFC3339Nano), want)
	}
}

// checkRetired checks the deletion of session id's status, old its last
// value: the attempt it shows ended must have been accrued.
func (c *Checker) checkRetired(key, id string, old state.Status, bad func(key, rule, format string, args ...any)) {
	qr, _, bound, ended, ok := state.EndedStatus(old)
	if !ok || c.acct.live[c.k.Accrual(id, qr)] {
		return
	}
	bad(key, RuleRetiredUnaccrued, "retired (%s) with its attempt of queue revision %d (bound %s, ended %s) never accrued: its GPU-hours are lost",
		old.Phase, qr, bound.Format(time.RFC3339Nano), ended.Format(time.RFC3339Nano))
}
