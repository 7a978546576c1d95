package placer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/voyager-gpu/voyager/internal/benchsum"
	"github.com/voyager-gpu/voyager/state"
)

// The placement ceiling: every bind transaction the placers committed is
// recorded (compares, operations, revision) through a wrapper of the
// placer's etcd KV, then committed again on the same etcd under another key
// prefix with no planning: the same transactions (sizes, compares, values),
// in the same order, with as many in flight as the placers had at most.
// Bindings per second of that replay is the most any placer could reach
// with this write pattern on this etcd; placement is reported as a
// fraction of it. Both are timed the same way: the benchmark's binding
// watch (boundWatch, the same handler) observes the replay's prefix as it
// observes placement's, and each window ends at the last binding that
// watch sees, so the watch's delivery and its cost fall in both.

// recordedTxn is one committed bind transaction.
type recordedTxn struct {
	rev      int64 // the revision it committed at
	cmps     []clientv3.Cmp
	ops      []clientv3.Op
	sessions int // queue entries it deleted: sessions bound
}

// txnRecorder collects the placers' committed bind transactions.
type txnRecorder struct {
	bindingDir []byte
	mu         sync.Mutex
	txns       []recordedTxn
	inFlight   int
	maxFlight  int
	// trips are the bind transactions' round trips, committed or not.
	trips []roundTrip
}

// roundTrip is one bind transaction's, as its sender saw it: from its
// Commit call to the answer's return.
type roundTrip struct{ sent, answered time.Time }

// tripStats are a window's round trips: when the first was sent, how many
// were in flight on average from then to the last answer, and the median
// round trip. With as many in flight on both sides, a slower rate is
// longer round trips: etcd's, or the wait for the sender's goroutines to
// run.
func tripStats(trips []roundTrip) (first time.Time, inFlight float64, median time.Duration) {
	if len(trips) == 0 {
		return time.Time{}, 0, 0
	}
	from, to := trips[0].sent, trips[0].answered
	var sum time.Duration
	took := make([]time.Duration, len(trips))
	for i, t := range trips {
		from, to = minTime(from, t.sent), maxTime(to, t.answered)
		took[i] = t.answered.Sub(t.sent)
		sum += took[i]
	}
	slices.Sort(took)
	if to.After(from) {
		inFlight = float64(sum) / float64(to.Sub(from))
	}
	return from, inFlight, took[len(took)/2]
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (r *txnRecorder) sorted() []recordedTxn {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]recordedTxn(nil), r.txns...)
	sort.Slice(out, func(i, j int) bool { return out[i].rev < out[j].rev })
	return out
}

// recKV wraps a KV so that its transactions are recorded.
type recKV struct {
	clientv3.KV
	r *txnRecorder
}

func (k recKV) Txn(ctx context.Context) clientv3.Txn {
	return &recTxn{Txn: k.KV.Txn(ctx), r: k.r}
}

type recTxn struct {
	clientv3.Txn
	r    *txnRecorder
	cmps []clientv3.Cmp
	ops  []clientv3.Op
}

func (t *recTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.cmps = append(t.cmps, cs...)
	t.Txn = t.Txn.If(cs...)
	return t
}

func (t *recTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.ops = append(t.ops, ops...)
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *recTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Else(ops...)
	return t
}

func (t *recTxn) Commit() (*clientv3.TxnResponse, error) {
	bind := false
	for _, op := range t.ops {
		if op.IsPut() && bytes.HasPrefix(op.KeyBytes(), t.r.bindingDir) {
			bind = true
		}
	}
	if !bind {
		return t.Txn.Commit()
	}
	t.r.mu.Lock()
	t.r.inFlight++
	t.r.maxFlight = max(t.r.maxFlight, t.r.inFlight)
	t.r.mu.Unlock()
	sent := time.Now()
	resp, err := t.Txn.Commit()
	answered := time.Now()
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	t.r.trips = append(t.r.trips, roundTrip{sent, answered})
	t.r.inFlight--
	if err == nil && resp.Succeeded {
		n := 0
		for _, op := range t.ops {
			if op.IsDelete() {
				n++
			}
		}
		t.r.txns = append(t.r.txns, recordedTxn{rev: resp.Header.Revision, cmps: t.cmps, ops: t.ops, sessions: n})
	}
	return resp, err
}

// startRecordedPlacers starts n placers whose bind transactions rec
// records. It returns them and a func that stops them all.
func startRecordedPlacers(b *testing.B, endpoint string, n int, cfg Config, rec *txnRecorder) ([]*Placer, func()) {
	var ps []*Placer
	var stops []func()
	for i := 0; i < n; i++ {
		p, stop, _ := runPlacer(b, endpoint, cfg, func(cli *clientv3.Client) { cli.KV = recKV{KV: cli.KV, r: rec} })
		ps = append(ps, p)
		stops = append(stops, stop)
	}
	return ps, func() {
		for _, s := range stops {
			s()
		}
	}
}

// replayed is one replay's result: sessions bound per second over its
// window, from its first transaction to the watch's last binding, and the
// CPU this process used in it.
type replayed struct {
	rate float64
	// steady is the rate from the first binding the watch saw to the
	// last: the window without the first transaction's round trip.
	steady     float64
	sessions   int
	start, end time.Time
	cpu        time.Duration // this process's, from start to the last binding
	trips      []roundTrip
}

// ceilingReplay commits txns again on cli under the prefix to instead of
// from, with workers in flight, and returns sessions bound per second. The
// keys the transactions compare are first copied as they were at revision
// at (before placement began). Every compare of a mod revision r is
// rewritten to the revision the replay wrote that key at for r, and a
// transaction waits until every such revision exists, as a placer must see
// a ledger before it can bind on it. A replayed transaction whose compares
// fail is a broken replay, and fails the benchmark.
func ceilingReplay(b *testing.B, cli *clientv3.Client, txns []recordedTxn, from, to string, at int64, workers int) replayed {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	toKeys, err := state.NewKeys(to)
	if err != nil {
		b.Fatal(err)
	}
	var seenMu sync.Mutex
	var firstSeen, lastSeen time.Time
	seen := 0
	var cpuStart, cpuAtLast time.Duration
	countBindings(b, ctx, cli, toKeys, func() {
		cpu := benchsum.ProcessCPU(b) // as placement's watch reads it at each binding
		seenMu.Lock()
		seen++
		lastSeen = time.Now()
		if seen == 1 {
			firstSeen = lastSeen
		}
		cpuAtLast = cpu
		seenMu.Unlock()
	})
	type keyRev struct {
		key string
		rev int64
	}
	written := map[int64]bool{}
	for _, t := range txns {
		written[t.rev] = true
	}
	// What the transactions compare that placement did not write: queue
	// entries and nodes as they were before placement.
	need := map[string]bool{}
	for _, t := range txns {
		for _, c := range t.cmps {
			pc := c.GetCompare()
			if pc.Target != pb.Compare_MOD || pc.Result != pb.Compare_EQUAL {
				b.Fatalf("replay: compare %v of %s is not mod revision =", pc.Target, pc.Key)
			}
			if r := pc.GetModRevision(); r != 0 && !written[r] {
				need[string(pc.Key)] = true
			}
		}
	}
	mapped := map[keyRev]int64{}
	resp, err := cli.Get(ctx, from+"/", clientv3.WithPrefix(), clientv3.WithRev(at))
	if err != nil {
		b.Fatal(err)
	}
	var ops []clientv3.Op
	var keys []keyRev
	flush := func() {
		if len(ops) == 0 {
			return
		}
		r, err := cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			b.Fatal(err)
		}
		for _, k := range keys {
			mapped[k] = r.Header.Revision
		}
		ops, keys = ops[:0], keys[:0]
	}
	for _, kv := range resp.Kvs {
		if !need[string(kv.Key)] {
			continue
		}
		ops = append(ops, clientv3.OpPut(to+string(kv.Key[len(from):]), string(kv.Value)))
		keys = append(keys, keyRev{string(kv.Key), kv.ModRevision})
		if len(ops) == 100 {
			flush()
		}
	}
	flush()

	var mu sync.Mutex
	cond := sync.NewCond(&mu)
	broken := false // a replayed transaction failed: waiters give up
	// build rewrites t for the replay prefix; it waits until every
	// revision it compares has been written by the replay.
	build := func(t recordedTxn) ([]clientv3.Cmp, []clientv3.Op, error) {
		cmps := make([]clientv3.Cmp, len(t.cmps))
		mu.Lock()
		for i, c := range t.cmps {
			pc := c.GetCompare()
			key := string(pc.Key)
			r := pc.GetModRevision()
			nr := int64(0)
			if r != 0 {
				for {
					var ok bool
					if nr, ok = mapped[keyRev{key, r}]; ok {
						break
					}
					if broken || !written[r] {
						mu.Unlock()
						return nil, nil, fmt.Errorf("replay: %s at revision %d was not copied, or the replay of its transaction failed", key, r)
					}
					cond.Wait()
				}
			}
			cmps[i] = clientv3.Compare(clientv3.ModRevision(to+key[len(from):]), "=", nr)
		}
		mu.Unlock()
		ops := make([]clientv3.Op, len(t.ops))
		for i, op := range t.ops {
			key := to + string(op.KeyBytes()[len(from):])
			switch {
			case op.IsPut():
				ops[i] = clientv3.OpPut(key, string(op.ValueBytes()))
			case op.IsDelete():
				ops[i] = clientv3.OpDelete(key)
			default:
				return nil, nil, fmt.Errorf("replay: op on %s is neither put nor delete", op.KeyBytes())
			}
		}
		return cmps, ops, nil
	}
	ch := make(chan recordedTxn)
	var wg sync.WaitGroup
	var tripsMu sync.Mutex
	var trips []roundTrip
	// From a collected heap, as placement starts (benchBurst).
	runtime.GC()
	start := time.Now()
	cpuStart = benchsum.ProcessCPU(b)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := range ch {
				cmps, ops, err := build(t)
				var r *clientv3.TxnResponse
				if err == nil {
					sent := time.Now()
					r, err = cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
					tripsMu.Lock()
					trips = append(trips, roundTrip{sent, time.Now()})
					tripsMu.Unlock()
				}
				if err == nil && !r.Succeeded {
					err = errors.New("refused: the replay is broken")
				}
				if err != nil {
					b.Errorf("replay the transaction at revision %d: %v", t.rev, err)
					mu.Lock()
					broken = true
					cond.Broadcast()
					mu.Unlock()
					continue
				}
				mu.Lock()
				for _, op := range t.ops {
					if op.IsPut() {
						mapped[keyRev{string(op.KeyBytes()), t.rev}] = r.Header.Revision
					}
				}
				cond.Broadcast()
				mu.Unlock()
			}
		}()
	}
	sessions := 0
	for _, t := range txns {
		ch <- t
		sessions += t.sessions
	}
	close(ch)
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	// Every replayed bind has committed; the window ends when the watch
	// has seen them all, as placement's does.
	eventuallyEvery(b, time.Minute, time.Millisecond, "the replay's bindings to reach the benchmark's watch", func() bool {
		seenMu.Lock()
		defer seenMu.Unlock()
		return seen >= sessions
	})
	seenMu.Lock()
	first, end, cpu := firstSeen, lastSeen, cpuAtLast-cpuStart
	seenMu.Unlock()
	return replayed{rate: float64(sessions) / end.Sub(start).Seconds(), steady: steadyRate(sessions, first, end),
		sessions: sessions, start: start, end: end, cpu: cpu, trips: trips}
}

// steadyRate is sessions per second from the first binding of a window to
// its last (n bindings, n-1 intervals).
func steadyRate(n int, first, last time.Time) float64 {
	if n < 2 || !last.After(first) {
		return 0
	}
	return float64(n-1) / last.Sub(first).Seconds()
}

// ceilingWorkers is how many replay transactions are in flight: as many as
// the placers had at most, and at least one.
func ceilingWorkers(rec *txnRecorder) int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return max(rec.maxFlight, 1)
}
