package state

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// MaxAccrueAll is the most attempts AccrueAll records in one transaction:
// each takes three reads, three compares and one write, and their days one
// read, compare and write each, within etcd's operation limit.
const MaxAccrueAll = 32

// ErrDaysSpanned means the attempts given to AccrueAll span together more
// days than one transaction can record: record them in smaller batches,
// or one by one (Accrue).
var ErrDaysSpanned = errors.New("attempts span too many days for one transaction")

// Ended is an attempt that ended, to be recorded by AccrueAll: its
// session, queueing, attempt, bound and end times, its size when it is an
// elastic job's (AttemptGPUs), and Rev, the revision of the status change
// that ended it (a spec retired since is read as it was just before).
type Ended struct {
	Session       string
	QueueRevision int64
	Attempt       int
	Bound, Ended  time.Time
	Size          int
	Rev           int64
	// Finished is true when the attempt ran to its session's end (a
	// terminal status but Lost), false when something cut it short (a
	// back-off, a preemption or a lost node's re-queue, a lost node, a
	// status deleted): only a finished attempt's run time says how long
	// its owner's work runs (LearnRuntimes). AccrueAll does not read it.
	Finished bool
}

// AccrueAll records the attempts in ended (at most MaxAccrueAll) as Accrue
// records each, in one read (their sessions' specs, their accrual marks
// and the days they span) and one transaction, which compares every mark
// still absent, every session's status still present and every day record
// at the revision read, and every spec read at its revision, and writes the marks, the days and, with cursor,
// the accountant's progress. It returns, by attempt, whether it was
// recorded (false: counted before), and the attempts whose spec or status
// is gone now (missing: not recorded; the caller records them one by one,
// Accrue, which reads a retired spec at Rev-1 and refuses a retired
// status).
// ErrConflict means the transaction was refused (a day moved, a status
// went, another accountant counted one): nothing was written, and the
// caller records them one by one (Accrue), which tells these apart.
func AccrueAll(ctx context.Context, kv clientv3.KV, k Keys, ended []Ended, cursor *UsageCursor, now time.Time) (done []bool, missing []int, err error) {
	if len(ended) > MaxAccrueAll {
		return nil, nil, fmt.Errorf("accrue %d attempts: more than %d in one transaction", len(ended), MaxAccrueAll)
	}
	// The days any attempt spans, whatever its GPUs (none: no day).
	dayIdx := map[string]int{}
	var names []string
	for _, e := range ended {
		to := e.Ended
		if GPUMillis(1, e.Bound, to) == 0 {
			to = maxTime(e.Ended, e.Bound)
		}
		days := SplitByDay(1, e.Bound, to)
		if len(days) > maxAccrualDays {
			return nil, nil, fmt.Errorf("accrue %s: the attempt spans %d days, more than one transaction can record (%d)",
				k.Accrual(e.Session, e.QueueRevision), len(days), maxAccrualDays)
		}
		for d := range days {
			if _, ok := dayIdx[d]; !ok {
				dayIdx[d] = 0
				names = append(names, d)
			}
		}
	}
	sort.Strings(names)
	if len(names) > maxAccrualDays {
		return nil, nil, fmt.Errorf("accrue %d attempts: they span %d days, more than one transaction can record (%d): %w", len(ended), len(names), maxAccrualDays, ErrDaysSpanned)
	}
	for i, d := range names {
		dayIdx[d] = i
	}
	// From any member that has applied the latest change read (Ended.Rev):
	// a mark found stays (counted), what is gone is handed back, and the
	// transaction compares the rest.
	var atLeast int64
	for _, e := range ended {
		atLeast = max(atLeast, e.Rev)
	}
	read, err := ReadAtLeast(ctx, kv, atLeast, func(o ...clientv3.OpOption) []clientv3.Op {
		gets := make([]clientv3.Op, 0, 3*len(ended)+len(names))
		for _, e := range ended {
			gets = append(gets, clientv3.OpGet(k.Session(e.Session), o...), clientv3.OpGet(k.Accrual(e.Session, e.QueueRevision), append(o, clientv3.WithCountOnly())...),
				clientv3.OpGet(k.Status(e.Session), append(o, clientv3.WithCountOnly())...))
		}
		for _, d := range names {
			gets = append(gets, clientv3.OpGet(k.key(dirGPUHours, d), o...))
		}
		return gets
	})
	if err != nil {
		return nil, nil, fmt.Errorf("accrue %d attempts: %w", len(ended), err)
	}
	dayVals := make([]UsageDay, len(names))
	cmps := make([]clientv3.Cmp, 0, 2*len(ended)+len(names))
	for i, d := range names {
		key := k.key(dirGPUHours, d)
		day := UsageDay{Day: d}
		var rev int64
		if kvs := read.Responses[3*len(ended)+i].GetResponseRange().Kvs; len(kvs) > 0 {
			if day, err = Decode[UsageDay](kvs[0].Value); err != nil {
				return nil, nil, fmt.Errorf("accrue: read %s: %w", key, err)
			}
			rev = kvs[0].ModRevision
		}
		if day.GPUMilliseconds == nil {
			day.GPUMilliseconds = map[string]int64{}
		}
		dayVals[i] = day
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", rev))
	}
	done = make([]bool, len(ended))
	var ops []clientv3.Op
	touched := map[int]bool{}
	for i, e := range ended {
		mark := k.Accrual(e.Session, e.QueueRevision)
		skvs := read.Responses[3*i].GetResponseRange().Kvs
		if read.Responses[3*i+1].GetResponseRange().Count > 0 {
			continue // counted before
		}
		if len(skvs) == 0 || read.Responses[3*i+2].GetResponseRange().Count == 0 {
			missing = append(missing, i) // retired: Accrue tells which
			continue
		}
		spec, err := Decode[Session](skvs[0].Value)
		if err != nil {
			return nil, nil, fmt.Errorf("accrue %s: read spec: %w", mark, err)
		}
		a := Accrual{Session: e.Session, Owner: spec.Owner, Team: spec.Team, Attempt: e.Attempt, QueueRevision: e.QueueRevision,
			GPUs: AttemptGPUs(spec, e.Size), Bound: e.Bound.UTC(), Ended: e.Ended.UTC(), Accrued: now.UTC()}
		if a.GPUMilliseconds = GPUMillis(a.GPUs, a.Bound, a.Ended); a.GPUMilliseconds == 0 {
			a.Ended = maxTime(a.Ended, a.Bound)
		}
		v, err := Encode(a)
		if err != nil {
			return nil, nil, fmt.Errorf("accrue %s: %w", mark, err)
		}
		// The session's status must still exist, as Accrue requires.
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(mark), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(k.Status(e.Session)), ">", 0),
			clientv3.Compare(clientv3.ModRevision(k.Session(e.Session)), "=", skvs[0].ModRevision))
		ops = append(ops, clientv3.OpPut(mark, v))
		subject := UsageSubject(a.Team, a.Owner)
		for d, ms := range SplitByDay(a.GPUs, a.Bound, a.Ended) {
			j := dayIdx[d]
			dayVals[j].GPUMilliseconds[subject] += ms
			dayVals[j].Attempts++
			dayVals[j].Updated = now.UTC()
			touched[j] = true
		}
		done[i] = true
	}
	for j := range names {
		if !touched[j] {
			continue
		}
		dv, err := Encode(dayVals[j])
		if err != nil {
			return nil, nil, fmt.Errorf("accrue: %w", err)
		}
		ops = append(ops, clientv3.OpPut(k.key(dirGPUHours, names[j]), dv))
	}
	if len(ops) == 0 {
		return done, missing, nil
	}
	if cursor != nil {
		cv, err := Encode(cursor)
		if err != nil {
			return nil, nil, fmt.Errorf("accrue: %w", err)
		}
		ops = append(ops, clientv3.OpPut(k.UsageCursor(), cv))
	}
	resp, err := kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return nil, nil, fmt.Errorf("accrue %d attempts: %w", len(ended), err)
	}
	if !resp.Succeeded {
		return nil, nil, fmt.Errorf("accrue %d attempts: %w", len(ended), ErrConflict)
	}
	return done, missing, nil
}
