package state

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// GPU-hours: the usage accountant (lifecycle.Accountant) records each
// bound attempt of a session once it ended, as an Accrual at
// accruals/<id>/<queueRevision>, and adds its GPU-time to one UsageDay per
// UTC day it spanned, at gpuhours/<yyyy-mm-dd>, in one transaction that
// requires the accrual key to be new: an attempt is counted exactly once
// however many accountants, restarts or replays see its end.

const (
	dirAccruals = "accruals"
	dirGPUHours = "gpuhours"
	dirCursors  = "cursors"
)

// Accruals is the prefix of every accrual.
func (k Keys) Accruals() string { return k.dir(dirAccruals) }

// SessionAccruals is the prefix of session id's accruals.
func (k Keys) SessionAccruals(id string) string { return k.key(dirAccruals, id) + "/" }

// Accrual is the key of the accrual of session id's attempt that consumed
// the queue entry of revision queueRevision (Status.QueueRevision).
func (k Keys) Accrual(id string, queueRevision int64) string {
	return k.key2(dirAccruals, id, strconv.FormatInt(queueRevision, 10))
}

// AccrualKey splits a key under accruals/ into session id and queue
// revision.
func (k Keys) AccrualKey(key string) (id string, queueRevision int64, ok bool) {
	if !k.hasDir(dirAccruals, key) {
		return "", 0, false
	}
	parts := k.splitIn(dirAccruals, key)
	if len(parts) != 2 || parts[0] == "" {
		return "", 0, false
	}
	qr, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || qr <= 0 {
		return "", 0, false
	}
	return parts[0], qr, true
}

// GPUHoursDir is the prefix of the daily usage records.
func (k Keys) GPUHoursDir() string { return k.dir(dirGPUHours) }

// UsageDayKey is the key of day's usage record; day is a UTC date.
func (k Keys) UsageDayKey(day time.Time) string { return k.key(dirGPUHours, DayOf(day)) }

// Cursors is the prefix of the components' progress records.
func (k Keys) Cursors() string { return k.dir(dirCursors) }

// UsageCursor is the key of the usage accountant's progress.
func (k Keys) UsageCursor() string { return k.key(dirCursors, "usage") }

// DayOf is t's UTC date, "2006-01-02".
func DayOf(t time.Time) string { return t.UTC().Format(time.DateOnly) }

// Accrual is one ended attempt of a session: who used how many GPUs from
// when to when, stored at accruals/<id>/<queueRevision>.
type Accrual struct {
	Session string `json:"session"`
	Owner   string `json:"owner"`
	// Team is the session's team (Session.Team); empty: none.
	Team          string `json:"team,omitempty"`
	Attempt       int    `json:"attempt"`
	QueueRevision int64  `json:"queueRevision"`
	// GPUs are the devices the attempt held: every part's GPUs (or MIG
	// devices) together.
	GPUs int `json:"gpus"`
	// Bound and Ended are the attempt's bound time (Status.Bound) and its
	// end: the status's Finished, or the time of the write that moved it
	// out of the bound phases (to Pending for a restart or re-queue).
	Bound time.Time `json:"bound"`
	Ended time.Time `json:"ended"`
	// GPUMilliseconds is GPUs × (Ended − Bound), in milliseconds.
	GPUMilliseconds int64 `json:"gpuMilliseconds"`
	// Accrued is when the accountant wrote it.
	Accrued time.Time `json:"accrued"`
}

// UsageDay is the GPU-time of every attempt the accountant counted that
// overlapped one UTC day, stored at gpuhours/<yyyy-mm-dd>.
type UsageDay struct {
	Day string `json:"day"`
	// GPUMilliseconds is the GPU-time within the day by UsageSubject
	// ("team/owner"; "/owner" for a session of no team).
	GPUMilliseconds map[string]int64 `json:"gpuMilliseconds"`
	// Attempts counts the accruals that added to it.
	Attempts int       `json:"attempts"`
	Updated  time.Time `json:"updated"`
}

// UsageSubject is the key of UsageDay.GPUMilliseconds for owner's use in
// team.
func UsageSubject(team, owner string) string { return team + "/" + owner }

// SplitUsageSubject splits a UsageDay key into team and owner.
func SplitUsageSubject(s string) (team, owner string) {
	team, owner, _ = strings.Cut(s, "/")
	return team, owner
}

// UsageCursor is the usage accountant's progress, stored at
// cursors/usage: every status change up to Revision has been accounted.
type UsageCursor struct {
	Revision int64     `json:"revision"`
	Updated  time.Time `json:"updated"`
}

// SessionGPUs is the number of devices every part of s holds together:
// the head's, each Ray worker's, or each rank's of a multi-node job.
func SessionGPUs(s Session) int {
	n := 0
	for _, p := range NewQueueEntry(s, s.Created).Parts() {
		n += p.GPUs
	}
	return n
}

// GPUMillis is gpus × (to − from) in milliseconds; 0 when to is not after
// from.
func GPUMillis(gpus int, from, to time.Time) int64 {
	if !to.After(from) {
		return 0
	}
	return int64(gpus) * to.Sub(from).Milliseconds()
}

// SplitByDay splits [from, to) at UTC midnights: the GPU-milliseconds of
// gpus devices held over it, by day. The parts sum to GPUMillis(gpus,
// from, to).
func SplitByDay(gpus int, from, to time.Time) map[string]int64 {
	out := map[string]int64{}
	total := GPUMillis(gpus, from, to)
	if total == 0 {
		return out
	}
	from, to = from.UTC(), to.UTC()
	var sum int64
	for cur := from; cur.Before(to); {
		next := time.Date(cur.Year(), cur.Month(), cur.Day()+1, 0, 0, 0, 0, time.UTC)
		end := next
		if to.Before(end) {
			end = to
		}
		// Milliseconds from the start, so that rounding never loses one.
		upto := GPUMillis(gpus, from, end)
		out[DayOf(cur)] += upto - sum
		sum = upto
		cur = next
	}
	return out
}

// maxAccrualDays bounds the days one accrual spans, so its transaction
// (one write per day) stays within etcd's operation limit.
const maxAccrualDays = DefaultMaxTxnOps - 8

// Accrue records attempt a in one transaction: the accrual key, which must
// not exist, and its GPU-time added to every day it spans; with cursor,
// the accountant's progress too. It returns false, writing nothing, when
// the accrual exists (counted before), ErrNotFound when the session's
// status is gone (retired: too late to count), and ErrConflict when a day
// record changed since it was read (read again and retry).
func Accrue(ctx context.Context, kv clientv3.KV, k Keys, a Accrual, cursor *UsageCursor, now time.Time) (bool, error) {
	if a.GPUMilliseconds = GPUMillis(a.GPUs, a.Bound, a.Ended); a.GPUMilliseconds == 0 {
		a.Ended = maxTime(a.Ended, a.Bound)
	}
	a.Accrued = now.UTC()
	mark := k.Accrual(a.Session, a.QueueRevision)
	days := SplitByDay(a.GPUs, a.Bound, a.Ended)
	if len(days) > maxAccrualDays {
		return false, fmt.Errorf("accrue %s: the attempt spans %d days, more than one transaction can record (%d)", mark, len(days), maxAccrualDays)
	}
	names := make([]string, 0, len(days))
	for d := range days {
		names = append(names, d)
	}
	sort.Strings(names)
	gets := make([]clientv3.Op, len(names))
	for i, d := range names {
		gets[i] = clientv3.OpGet(k.key(dirGPUHours, d))
	}
	read, err := kv.Txn(ctx).Then(append(gets, clientv3.OpGet(mark, clientv3.WithCountOnly()))...).Commit()
	if err != nil {
		return false, fmt.Errorf("accrue %s: %w", mark, err)
	}
	if read.Responses[len(names)].GetResponseRange().Count > 0 {
		return false, nil
	}
	// The session's status must still exist: the marks of retired
	// sessions may then be deleted (lifecycle.Accountant.SweepMarks)
	// without a late replay of an old change counting their attempts again.
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(mark), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(k.Status(a.Session)), ">", 0)}
	v, err := Encode(a)
	if err != nil {
		return false, fmt.Errorf("accrue %s: %w", mark, err)
	}
	ops := []clientv3.Op{clientv3.OpPut(mark, v)}
	subject := UsageSubject(a.Team, a.Owner)
	for i, d := range names {
		key := k.key(dirGPUHours, d)
		day := UsageDay{Day: d, GPUMilliseconds: map[string]int64{}}
		var rev int64
		if kvs := read.Responses[i].GetResponseRange().Kvs; len(kvs) > 0 {
			if day, err = Decode[UsageDay](kvs[0].Value); err != nil {
				return false, fmt.Errorf("accrue %s: read %s: %w", mark, key, err)
			}
			if day.GPUMilliseconds == nil {
				day.GPUMilliseconds = map[string]int64{}
			}
			rev = kvs[0].ModRevision
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", rev))
		day.GPUMilliseconds[subject] += days[d]
		day.Attempts++
		day.Updated = now.UTC()
		dv, err := Encode(day)
		if err != nil {
			return false, fmt.Errorf("accrue %s: %w", mark, err)
		}
		ops = append(ops, clientv3.OpPut(key, dv))
	}
	if cursor != nil {
		cv, err := Encode(cursor)
		if err != nil {
			return false, fmt.Errorf("accrue %s: %w", mark, err)
		}
		ops = append(ops, clientv3.OpPut(k.UsageCursor(), cv))
	}
	resp, err := kv.Txn(ctx).If(cmps...).Then(ops...).Else(clientv3.OpGet(mark, clientv3.WithCountOnly()),
		clientv3.OpGet(k.Status(a.Session), clientv3.WithCountOnly())).Commit()
	if err != nil {
		return false, fmt.Errorf("accrue %s: %w", mark, err)
	}
	if !resp.Succeeded {
		switch {
		case resp.Responses[0].GetResponseRange().Count > 0:
			return false, nil // another accountant counted it meanwhile
		case resp.Responses[1].GetResponseRange().Count == 0:
			return false, fmt.Errorf("accrue %s: the session's status is gone (retired): %w", mark, ErrNotFound)
		}
		return false, fmt.Errorf("accrue %s: %w", mark, ErrConflict)
	}
	return true, nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// BoundPhase reports whether a session in phase p holds its GPUs: Bound,
// Starting, Running or Stopping. An attempt's GPU-time runs from its bind
// until its status leaves these phases.
func BoundPhase(p Phase) bool {
	switch p {
	case PhaseBound, PhaseStarting, PhaseRunning, PhaseStopping:
		return true
	}
	return false
}

// EndedAttempt returns the attempt that a status change ended: prev is
// the status before the change (nil: none), cur after it (nil: deleted),
// at is the change's time for a deletion. ok is false when the change
// ended no bound attempt.
func EndedAttempt(prev, cur *Status, at time.Time) (queueRevision int64, attempt int, bound, ended time.Time, ok bool) {
	if prev == nil || !BoundPhase(prev.Phase) || prev.Bound == nil || prev.QueueRevision <= 0 {
		return 0, 0, time.Time{}, time.Time{}, false
	}
	if cur != nil && BoundPhase(cur.Phase) && cur.QueueRevision == prev.QueueRevision {
		return 0, 0, time.Time{}, time.Time{}, false // still the same attempt
	}
	ended = at
	if cur != nil {
		ended = cur.Updated
		if cur.Finished != nil {
			ended = *cur.Finished
		}
	}
	return prev.QueueRevision, prev.Attempt, *prev.Bound, ended, true
}

// EndedStatus returns the attempt a status shows ended (a listed status,
// whose previous values are not known): one with its bound time kept that
// is terminal or waits to run again (Pending with RetryAt).
func EndedStatus(st Status) (queueRevision int64, attempt int, bound, ended time.Time, ok bool) {
	if st.Bound == nil || st.QueueRevision <= 0 || BoundPhase(st.Phase) {
		return 0, 0, time.Time{}, time.Time{}, false
	}
	if !st.Phase.Terminal() && !st.Waiting() {
		return 0, 0, time.Time{}, time.Time{}, false
	}
	ended = st.Updated
	if st.Finished != nil {
		ended = *st.Finished
	}
	return st.QueueRevision, st.Attempt, *st.Bound, ended, true
}
