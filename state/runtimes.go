package state

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Run times learned from history. A declared max runtime bounds when a
// session ends; where people declare the most allowed whatever they run,
// that bound says nothing, and the placer's holds and drain fit cannot
// tell a node about to empty from one that runs for days. An owner's
// recent run times say more (people run the same job many times: a sweep,
// a nightly training): the usage accountant adds each finished attempt's
// GPU time and declared max runtime to its owner's RuntimeRecord, and
// where the owner's recent runs of a size all declared several times what
// they ran and took about as long as each other, the placer expects the
// next to hold its GPUs no longer than the longest of them, never longer than its max runtime
// (Allocation.Expects). Where they declared about what they ran, the
// bound is the better guide (it is a promise, the history a guess), and
// the placer plans with the bound alone.

// dirRuntimes holds one RuntimeRecord per owner.
const dirRuntimes = "runtimes"

// RuntimeSamplesKept is how many of an owner's most recent finished
// attempts a RuntimeRecord keeps.
const RuntimeSamplesKept = 32

// RuntimeSample is one finished attempt: how long it held its GPUs.
type RuntimeSample struct {
	// Session and QueueRevision name the attempt (its accrual), so that
	// an attempt seen twice is kept once.
	Session       string `json:"session"`
	QueueRevision int64  `json:"queueRevision"`
	// GPUs is what the attempt held, every part together.
	GPUs int `json:"gpus"`
	// Seconds is from its bind to its end (Accrual.Bound to Ended).
	Seconds int64 `json:"seconds"`
	// Declared is the max runtime it declared, in seconds (the session's
	// Limits.MaxRuntime when the attempt was learned); 0: none, or not
	// known.
	Declared int64     `json:"declared,omitempty"`
	Ended    time.Time `json:"ended"`
}

// RuntimeRecord is runtimes/<owner>: the owner's most recent finished
// attempts (at most RuntimeSamplesKept, oldest first), written by the
// usage accountant and read by the placer (Estimate). Advisory: a lost
// or wrong record makes the placer's guesses worse, never its binds
// unsafe.
type RuntimeRecord struct {
	Owner   string          `json:"owner"`
	Samples []RuntimeSample `json:"samples"`
	Updated time.Time       `json:"updated"`
}

// RuntimesDir is the prefix of every RuntimeRecord.
func (k Keys) RuntimesDir() string { return k.dir(dirRuntimes) }

// Runtimes is the key of owner's RuntimeRecord.
func (k Keys) Runtimes(owner string) string { return k.key(dirRuntimes, owner) }

// Add keeps s among r's samples, in order of their ends, the oldest
// dropped past RuntimeSamplesKept; false, changing nothing, when r holds
// that attempt already, or when s ended before every sample of a full
// record (it would be dropped at once: an attempt seen again after its
// record moved past it, which must not count as learned).
func (r *RuntimeRecord) Add(s RuntimeSample) bool {
	for _, o := range r.Samples {
		if o.Session == s.Session && o.QueueRevision == s.QueueRevision {
			return false
		}
	}
	i, _ := slices.BinarySearchFunc(r.Samples, s, func(a, b RuntimeSample) int {
		return cmp.Or(a.Ended.Compare(b.Ended), cmp.Compare(a.Session, b.Session), cmp.Compare(a.QueueRevision, b.QueueRevision))
	})
	if i < len(r.Samples)+1-RuntimeSamplesKept {
		return false
	}
	r.Samples = slices.Insert(r.Samples, i, s)
	if n := len(r.Samples); n > RuntimeSamplesKept {
		r.Samples = slices.Delete(r.Samples, 0, n-RuntimeSamplesKept)
	}
	return true
}

// Estimate is how long r's owner's next session of gpus GPUs is expected
// to hold them, as backfilling schedulers predict from a user's last jobs
// (Tsafrir, Etsion and Feitelson, 2007), but only where the owner's
// declared max runtimes say less: the longest of its last EstimateOver
// finished attempts of that size, when each of them declared a max
// runtime at least OverstatedBy times what it ran, and the longest is at
// most ConsistentWithin times the shortest. 0 (no estimate: plan with the
// bound) where fewer of that size finished, where they varied more, or
// where one of them declared none, or about what it ran: people who pick
// a max runtime from a ladder of round durations (15 min, 30 min, 1 h,
// 2 h, …) declare within 2–3× of their runs, and then the bound is the
// better guide.
func (r *RuntimeRecord) Estimate(gpus int) time.Duration {
	if r == nil {
		return 0
	}
	var most, least, n int64
	for i := len(r.Samples) - 1; i >= 0 && n < EstimateOver; i-- {
		s := &r.Samples[i]
		if s.GPUs != gpus {
			continue
		}
		if s.Declared <= 0 || s.Declared < OverstatedBy*s.Seconds {
			return 0
		}
		most = max(most, s.Seconds)
		if n == 0 || s.Seconds < least {
			least = s.Seconds
		}
		n++
	}
	if n < EstimateOver {
		return 0 // too few to tell a habit from chance
	}
	if most > ConsistentWithin*max(least, 1) {
		return 0 // runs that vary this much predict nothing
	}
	return max(time.Duration(most)*time.Second, time.Second)
}

// EstimateOver is how many of an owner's latest runs of a size Estimate
// reads.
const EstimateOver = 8

// OverstatedBy is how many times what they ran an owner's recent runs
// must have declared for Estimate to give an estimate.
const OverstatedBy = 4

// ConsistentWithin is how many times its shortest the longest of an
// owner's recent runs may be for Estimate to give an estimate: the same
// job run again (a sweep, a nightly training) takes about as long each
// time, where runs that vary more say little of the next one: eight runs
// of a log-normal run time of σ 0.3 fall within 4× of each other 98% of
// the time, eight draws of an exponential one 1% of the time.
const ConsistentWithin = 4

// LearnRuntimes adds the finished attempts named by their accruals
// (accruals/<session>/<queueRevision>, written by Accrue) to their owners'
// RuntimeRecords: it reads the accruals and the records, then writes each
// record changed in one transaction that compares every record it read
// unchanged (absent, for an owner with none), reading again on a refusal.
// An accrual not found is skipped (swept, or never written). It returns
// how many samples it added. It takes at most MaxAccrueAll attempts, so
// that its transaction stays within etcd's operation limit.
func LearnRuntimes(ctx context.Context, kv clientv3.KV, k Keys, attempts []AttemptKey, now time.Time) (int, error) {
	if len(attempts) == 0 {
		return 0, nil
	}
	if len(attempts) > MaxAccrueAll {
		return 0, fmt.Errorf("learn runtimes of %d attempts: more than %d in one transaction", len(attempts), MaxAccrueAll)
	}
	// Each attempt's accrual and its session's spec (the max runtime it
	// declared).
	gets := make([]clientv3.Op, 0, 2*len(attempts))
	for _, a := range attempts {
		gets = append(gets, clientv3.OpGet(k.Accrual(a.Session, a.QueueRevision)), clientv3.OpGet(k.Session(a.Session)))
	}
	read, err := kv.Txn(ctx).Then(gets...).Commit()
	if err != nil {
		return 0, fmt.Errorf("learn runtimes: read accruals: %w", err)
	}
	byOwner := map[string][]RuntimeSample{}
	var owners []string
	for i := range attempts {
		kvs := read.Responses[2*i].GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue
		}
		acc, err := Decode[Accrual](kvs[0].Value)
		if err != nil {
			return 0, fmt.Errorf("learn runtimes: read %s: %w", kvs[0].Key, err)
		}
		if acc.Owner == "" || acc.GPUs <= 0 || !acc.Ended.After(acc.Bound) {
			continue
		}
		if _, ok := byOwner[acc.Owner]; !ok {
			owners = append(owners, acc.Owner)
		}
		var declared int64 // the spec gone (retired): not known
		if skvs := read.Responses[2*i+1].GetResponseRange().Kvs; len(skvs) > 0 {
			if spec, err := Decode[Session](skvs[0].Value); err == nil {
				declared = int64(time.Duration(spec.Limits.MaxRuntime) / time.Second)
			}
		}
		byOwner[acc.Owner] = append(byOwner[acc.Owner], RuntimeSample{Session: acc.Session, QueueRevision: acc.QueueRevision,
			GPUs: acc.GPUs, Seconds: int64(acc.Ended.Sub(acc.Bound) / time.Second), Declared: declared, Ended: acc.Ended.UTC()})
	}
	if len(owners) == 0 {
		return 0, nil
	}
	slices.Sort(owners)
	for try := 0; ; try++ {
		added, err := learnOnce(ctx, kv, k, owners, byOwner, now)
		if err == nil || try >= 9 || !errors.Is(err, ErrConflict) {
			return added, err
		}
	}
}

// AttemptKey names one attempt of a session: the queue entry it consumed.
type AttemptKey struct {
	Session       string
	QueueRevision int64
}

// learnOnce reads the owners' records, adds their samples, and writes the
// changed ones, compared unchanged since the read; ErrConflict when one
// moved.
func learnOnce(ctx context.Context, kv clientv3.KV, k Keys, owners []string, byOwner map[string][]RuntimeSample, now time.Time) (int, error) {
	gets := make([]clientv3.Op, len(owners))
	for i, o := range owners {
		gets[i] = clientv3.OpGet(k.Runtimes(o))
	}
	read, err := kv.Txn(ctx).Then(gets...).Commit()
	if err != nil {
		return 0, fmt.Errorf("learn runtimes: read records: %w", err)
	}
	var (
		cmps  []clientv3.Cmp
		ops   []clientv3.Op
		added int
	)
	for i, o := range owners {
		rec := RuntimeRecord{Owner: o}
		var rev int64
		if kvs := read.Responses[i].GetResponseRange().Kvs; len(kvs) > 0 {
			if rec, err = Decode[RuntimeRecord](kvs[0].Value); err != nil {
				return 0, fmt.Errorf("learn runtimes: read %s: %w", k.Runtimes(o), err)
			}
			rev = kvs[0].ModRevision
		}
		n := 0
		for _, s := range byOwner[o] {
			if rec.Add(s) {
				n++
			}
		}
		if n == 0 {
			continue
		}
		rec.Owner, rec.Updated = o, now.UTC()
		v, err := Encode(rec)
		if err != nil {
			return 0, fmt.Errorf("learn runtimes: %w", err)
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k.Runtimes(o)), "=", rev))
		ops = append(ops, clientv3.OpPut(k.Runtimes(o), v))
		added += n
	}
	if len(ops) == 0 {
		return 0, nil
	}
	resp, err := kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return 0, fmt.Errorf("learn runtimes: %w", err)
	}
	if !resp.Succeeded {
		return 0, ErrConflict
	}
	return added, nil
}
