package lifecycle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/promfunc"
	"github.com/voyager-gpu/voyager/state"
)

// AccountantConfig configures an Accountant. Zero fields take the
// defaults.
type AccountantConfig struct {
	// Keys is the key schema. Default: state.DefaultPrefix.
	Keys state.Keys
	// CursorEvery is how often the progress (cursors/usage) is written
	// when no accrual wrote it. Default 10 s.
	CursorEvery time.Duration
	// SweepEvery is how often the accruals of retired sessions are
	// deleted (SweepMarks), besides once when the accountant is elected.
	// Default 1 hour.
	SweepEvery time.Duration
	// Gather is how long the accountant collects ended attempts after
	// the first one it sees before it records them, together, in one
	// read and one transaction (state.AccrueAll; sooner when
	// state.MaxAccrueAll are waiting). GPU-hours lag the ends by about
	// this much; retention waits for them (RetentionConfig.AccrualWait).
	// Default DefaultGather; negative: each watch response at once.
	Gather time.Duration
	// Logger receives structured logs. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// DefaultGather is AccountantConfig.Gather's default: at the soak's pace
// (about 60 ends a second) one transaction a second records them all,
// where one per watch response wrote about 0.8 a bind.
const DefaultGather = time.Second

// Accountant turns the ends of sessions' bound attempts into GPU-hours:
// for every status change that takes a session out of its bound phases
// (Bound, Starting, Running, Stopping: to an end, a back-off, a
// preemption, a lost node's re-queue) it records the attempt's accrual
// and adds its GPU-time to the days it spanned (state.Accrue). It follows
// the statuses' changes from its cursor (cursors/usage), so a change made
// while no accountant ran is counted when one starts again, as long as
// etcd still holds it; the accrual's key is created once, so a change seen
// twice (a replay, two accountants) counts once. One process leads at a
// time (elections/usage/).
//
// It also learns run times: after each batch of attempts it records, it
// adds those that finished (their sessions' terminal statuses, not a
// back-off, preemption, re-queue or lost node, which cut an attempt
// short) to their owners' RuntimeRecords (runtimes/<owner>,
// state.LearnRuntimes), from which the placer estimates when sessions
// end. That is advisory and apart from the accrual's transaction: a
// failure is logged and skipped, never holds the cursor, and a crash
// between an accrual's transaction and the learning loses those samples
// from the estimates (the cursor has moved past them), never any
// GPU-hours.
type Accountant struct {
	cfg AccountantConfig
	cli *clientv3.Client
	log *slog.Logger

	accrued, late, catchUps atomic.Int64
	// learned counts the run-time samples added to owners' records;
	// learnWarned is when learning last failed at Warn (learn, which
	// only the leading goroutine calls).
	learned     atomic.Int64
	learnWarned time.Time
	// gathered is how many ended attempts wait for Config.Gather.
	gathered atomic.Int64
	mu       sync.Mutex
	applied  int64 // the revision up to which changes were handled
}

// NewAccountant returns an accountant over cli.
func NewAccountant(cli *clientv3.Client, cfg AccountantConfig) *Accountant {
	if cfg.Keys == (state.Keys{}) {
		cfg.Keys = state.MustKeys(state.DefaultPrefix)
	}
	if cfg.CursorEvery <= 0 {
		cfg.CursorEvery = 10 * time.Second
	}
	if cfg.SweepEvery <= 0 {
		cfg.SweepEvery = time.Hour
	}
	if cfg.Gather == 0 {
		cfg.Gather = DefaultGather
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Accountant{cfg: cfg, cli: cli, log: cfg.Logger.With("component", "usage")}
}

// Accrued returns how many attempts this accountant recorded.
func (a *Accountant) Accrued() int64 { return a.accrued.Load() }

// Late returns how many ended attempts it could not record because their
// sessions had been retired first (or their specs compacted away).
func (a *Accountant) Late() int64 { return a.late.Load() }

// Learned returns how many finished attempts' run times this accountant
// added to their owners' records (runtimes/).
func (a *Accountant) Learned() int64 { return a.learned.Load() }

// CatchUps returns how many times this accountant counted from the
// statuses as listed (its start without a cursor, or a cursor behind
// etcd's compaction) rather than change by change.
func (a *Accountant) CatchUps() int64 { return a.catchUps.Load() }

// Applied returns the revision up to which this accountant has handled
// every status change.
func (a *Accountant) Applied() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.applied
}

// Run accounts while this process holds the usage election, until ctx
// ends. It returns nil when ctx is cancelled.
func (a *Accountant) Run(ctx context.Context) error {
	leadUntilDone(ctx, a.cli, a.cfg.Keys, "usage", a.log, a.follow)
	return nil
}

// follow handles every status change from the cursor on (or, without a
// usable cursor, the statuses as listed now and every change after),
// until ctx ends or the watch fails.
func (a *Accountant) follow(ctx context.Context) error {
	k := a.cfg.Keys
	sweepCtx, stopSweeping := context.WithCancel(ctx)
	var sweeping sync.WaitGroup
	sweeping.Go(func() { a.sweepMarks(sweepCtx) })
	defer func() {
		stopSweeping()
		sweeping.Wait()
	}()
	cur, _, err := state.Get[state.UsageCursor](ctx, a.cli, k.UsageCursor())
	if err != nil && !errors.Is(err, state.ErrNotFound) {
		return fmt.Errorf("read usage cursor: %w", err)
	}
	from := cur.Revision + 1
	if cur.Revision == 0 {
		if from, err = a.catchUp(ctx); err != nil {
			return err
		}
	}
	for {
		err := a.watch(ctx, from)
		if !errors.Is(err, rpctypes.ErrCompacted) {
			return err
		}
		// History before the cursor is gone: what changed there can no
		// longer be seen change by change. Count what the statuses show.
		a.log.Warn("usage cursor is behind etcd's compaction; accounting from the statuses as they are now", "cursor", from-1)
		if from, err = a.catchUp(ctx); err != nil {
			return err
		}
	}
}

// catchUp lists the statuses and the accruals' keys at one revision and
// records every attempt a status shows ended (a terminal status, or one
// waiting to run again, with its bound time) that has no accrual yet,
// state.MaxAccrueAll to a transaction, and returns the revision to watch
// from. It is this accountant's way back when its cursor is behind etcd's
// compaction: its cost is the attempts still to record, not every status
// etcd holds (one read and one transaction each took longer, with
// thousands of finished sessions, than the history etcd kept, so each
// catch-up ended behind compaction again while retention waited on it).
func (a *Accountant) catchUp(ctx context.Context) (int64, error) {
	k := a.cfg.Keys
	a.catchUps.Add(1)
	resp, err := a.cli.Txn(ctx).Then(
		clientv3.OpGet(k.StatusDir(), clientv3.WithPrefix()),
		clientv3.OpGet(k.Accruals(), clientv3.WithPrefix(), clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return 0, fmt.Errorf("list statuses: %w", err)
	}
	recorded := map[string]bool{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		recorded[string(kv.Key)] = true
	}
	var ended []state.Ended
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		st, err := state.Decode[state.Status](kv.Value)
		if err != nil {
			continue
		}
		if qr, att, bound, end, ok := state.EndedStatus(st); ok && !recorded[k.Accrual(st.Session, qr)] {
			ended = append(ended, state.Ended{Session: st.Session, QueueRevision: qr, Attempt: att, Bound: bound, Ended: end,
				Size: state.ElasticSize(&st), Rev: kv.ModRevision, Finished: finished(&st)})
		}
	}
	// In the order they ended: each transaction's cursor is its last
	// status change's.
	slices.SortFunc(ended, func(x, y state.Ended) int { return cmp.Compare(x.Rev, y.Rev) })
	for len(ended) > 0 {
		n := min(len(ended), state.MaxAccrueAll)
		if err := a.accrueAll(ctx, ended[:n]); err != nil {
			return 0, err
		}
		ended = ended[n:]
	}
	a.setApplied(resp.Header.Revision)
	return resp.Header.Revision + 1, nil
}

func (a *Accountant) watch(ctx context.Context, from int64) error {
	k := a.cfg.Keys
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := a.cli.Watch(wctx, k.StatusDir(), clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithRev(from), clientv3.WithProgressNotify())
	tick := time.NewTicker(a.cfg.CursorEvery)
	defer tick.Stop()
	written := from - 1
	// Ended attempts seen and not yet recorded, the revision up to which
	// the responses that carried them were read, and when they are
	// recorded (Config.Gather after the first).
	var gathered []state.Ended
	var gatheredTo int64
	var flushC <-chan time.Time
	var flushT *time.Timer
	defer func() {
		if flushT != nil {
			flushT.Stop()
		}
	}()
	flush := func(ctx context.Context) error {
		for len(gathered) > 0 {
			n := min(len(gathered), state.MaxAccrueAll)
			if err := a.accrueAll(ctx, gathered[:n]); err != nil {
				return err
			}
			gathered = gathered[n:]
		}
		gathered = nil
		a.gathered.Store(0)
		a.setApplied(gatheredTo)
		if flushT != nil {
			flushT.Stop()
		}
		flushT, flushC = nil, nil
		return nil
	}
	// An orderly stop records what it gathered (within a few seconds) and
	// writes the cursor, whether the context's end or the watch's closing
	// (which that end causes too, and which may come first) is seen
	// first. What it cannot record is not lost: the cursor stays before
	// it, and the next accountant sees it again.
	stop := func() {
		if len(gathered) > 0 {
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			if err := flush(fctx); err != nil {
				a.log.Debug("record the ends gathered before stopping", "err", err)
			}
			cancel()
		}
		a.writeCursor(a.Applied())
	}
	for {
		select {
		case <-ctx.Done():
			stop()
			return nil
		case <-tick.C:
			if rev := a.Applied(); rev > written {
				a.writeCursor(rev)
				written = rev
			}
		case <-flushC:
			if err := flush(ctx); err != nil {
				return err
			}
		case resp, ok := <-wch:
			if !ok {
				if ctx.Err() != nil {
					stop()
					return nil
				}
				return errors.New("usage watch closed")
			}
			// The responses waiting behind this one too (an accountant
			// behind the statuses catches up in batches).
			for {
				if err := resp.Err(); err != nil {
					if ctx.Err() != nil {
						stop()
						return nil
					}
					return fmt.Errorf("watch statuses: %w", err)
				}
				for _, ev := range resp.Events {
					if e, ok := a.ended(ev); ok {
						gathered = append(gathered, e)
					}
				}
				gatheredTo = max(gatheredTo, resp.Header.Revision)
				if len(gathered) >= state.MaxAccrueAll {
					break
				}
				select {
				case resp, ok = <-wch:
				default:
					ok = false
				}
				if !ok {
					break
				}
			}
			a.gathered.Store(int64(len(gathered)))
			switch {
			case len(gathered) >= state.MaxAccrueAll || (len(gathered) > 0 && a.cfg.Gather < 0) || len(gathered) == 0:
				// A full transaction's worth, gathering off, or nothing
				// waits: record now (nothing: only the revision moves).
				if err := flush(ctx); err != nil {
					return err
				}
			case flushT == nil:
				flushT = time.NewTimer(a.cfg.Gather)
				flushC = flushT.C
			}
		}
	}
}

// ended returns the attempt a status change ended, if it ended one.
func (a *Accountant) ended(ev *clientv3.Event) (state.Ended, bool) {
	var prev, cur *state.Status
	if ev.PrevKv != nil {
		if p, err := state.Decode[state.Status](ev.PrevKv.Value); err == nil {
			prev = &p
		}
	}
	if ev.Type == clientv3.EventTypePut {
		if c, err := state.Decode[state.Status](ev.Kv.Value); err == nil {
			cur = &c
		}
	}
	qr, att, bound, ended, ok := state.EndedAttempt(prev, cur, a.cfg.Now().UTC())
	if !ok {
		return state.Ended{}, false
	}
	id, _ := a.cfg.Keys.SessionID(string(ev.Kv.Key))
	// The status before the change is the ended attempt's: an elastic
	// job's size is the one it was bound at.
	return state.Ended{Session: id, QueueRevision: qr, Attempt: att, Bound: bound, Ended: ended,
		Size: state.ElasticSize(prev), Rev: ev.Kv.ModRevision, Finished: finished(cur)}, true
}

// finished reports whether st, the status that ended an attempt, ends its
// session after running its course (state.Ended.Finished): terminal, but
// not Lost, whose attempt its node's loss cut short. A deleted status
// (nil) and one waiting to run again (a back-off, a preemption, a lost
// node's re-queue) end an attempt cut short.
func finished(st *state.Status) bool {
	return st != nil && st.Phase.Terminal() && st.Phase != state.PhaseLost
}

// accrueAll records ended attempts (at most state.MaxAccrueAll) in one
// transaction (state.AccrueAll); those whose spec is gone, or all of them
// when that transaction is refused three times, one by one (accrue),
// which tells apart what refused it (and records attempts that together
// span more days than one transaction can). Then it learns the run times
// of those that finished (learn).
func (a *Accountant) accrueAll(ctx context.Context, ended []state.Ended) error {
	if err := a.accrueBatch(ctx, ended); err != nil {
		return err
	}
	a.learn(ctx, ended)
	return nil
}

// learn adds the finished attempts among ended (their accruals recorded)
// to their owners' run-time records in one transaction
// (state.LearnRuntimes). Advisory: a failure is logged, not returned, so
// the accountant and its cursor go on. Attempts recorded before (a
// replay) are learned again harmlessly: a record keeps an attempt once,
// and the accrual it reads is the one first written.
func (a *Accountant) learn(ctx context.Context, ended []state.Ended) {
	var finished []state.AttemptKey
	for _, e := range ended {
		if e.Finished {
			finished = append(finished, state.AttemptKey{Session: e.Session, QueueRevision: e.QueueRevision})
		}
	}
	if len(finished) == 0 {
		return
	}
	n, err := state.LearnRuntimes(ctx, a.cli, a.cfg.Keys, finished, a.cfg.Now())
	switch {
	case err != nil && ctx.Err() == nil && time.Since(a.learnWarned) >= time.Minute:
		// At most once a minute: a role without runtimes/ (a deployment
		// whose roles predate it) refuses every batch.
		a.learnWarned = time.Now()
		a.log.Warn("learn run times of finished attempts; their samples are left out of the estimates", "attempts", len(finished), "err", err)
	case err != nil:
		a.log.Debug("learn run times of finished attempts", "attempts", len(finished), "err", err)
	default:
		a.learned.Add(int64(n))
		a.log.Debug("run times learned", "attempts", len(finished), "samples", n)
	}
}

// accrueBatch is accrueAll's recording.
func (a *Accountant) accrueBatch(ctx context.Context, ended []state.Ended) error {
	last := ended[len(ended)-1].Rev
	var done []bool
	var missing []int
	var err error
	// A refused batch (a spec or day record moved) is read and tried
	// again a few times before it is recorded one attempt at a time.
	for try := 0; try < 3; try++ {
		done, missing, err = state.AccrueAll(ctx, a.cli, a.cfg.Keys, ended,
			&state.UsageCursor{Revision: last - 1, Updated: a.cfg.Now().UTC()}, a.cfg.Now())
		if !errors.Is(err, state.ErrConflict) {
			break
		}
	}
	switch {
	case err == nil:
		for i, ok := range done {
			if ok {
				a.accrued.Add(1)
				a.log.Debug("attempt accounted", "session", ended[i].Session, "queueRevision", ended[i].QueueRevision)
			}
		}
		for _, i := range missing {
			e := ended[i]
			if err := a.accrue(ctx, e.Session, e.QueueRevision, e.Attempt, e.Bound, e.Ended, e.Rev, e.Size); err != nil {
				return err
			}
		}
		return nil
	case errors.Is(err, state.ErrConflict), errors.Is(err, state.ErrDaysSpanned):
		for _, e := range ended {
			if err := a.accrue(ctx, e.Session, e.QueueRevision, e.Attempt, e.Bound, e.Ended, e.Rev, e.Size); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("accrue ended attempts: %w", err)
}

// accrue records one ended attempt of session id, reading its spec for
// the owner, team and GPUs (at rev-1 if it is gone now); size is the
// attempt's size when it is an elastic job's (state.AttemptGPUs).
func (a *Accountant) accrue(ctx context.Context, id string, qr int64, attempt int, bound, ended time.Time, rev int64, size int) error {
	k := a.cfg.Keys
	spec, _, err := state.Get[state.Session](ctx, a.cli, k.Session(id))
	if errors.Is(err, state.ErrNotFound) {
		var resp *clientv3.GetResponse
		if resp, err = a.cli.Get(ctx, k.Session(id), clientv3.WithRev(rev-1)); err == nil && len(resp.Kvs) > 0 {
			spec, err = state.Decode[state.Session](resp.Kvs[0].Value)
		} else if err == nil {
			err = state.ErrNotFound
		}
	}
	if err != nil {
		if errors.Is(err, state.ErrNotFound) || errors.Is(err, rpctypes.ErrCompacted) {
			a.late.Add(1)
			a.log.Warn("cannot account an ended attempt: its spec is gone", "session", id, "queueRevision", qr, "err", err)
			return nil
		}
		return fmt.Errorf("read spec of %s: %w", id, err)
	}
	acc := state.Accrual{Session: id, Owner: spec.Owner, Team: spec.Team, Attempt: attempt, QueueRevision: qr,
		GPUs: state.AttemptGPUs(spec, size), Bound: bound.UTC(), Ended: ended.UTC()}
	for try := 0; ; try++ {
		done, err := state.Accrue(ctx, a.cli, k, acc, &state.UsageCursor{Revision: rev - 1, Updated: a.cfg.Now().UTC()}, a.cfg.Now())
		switch {
		case err == nil:
			if done {
				a.accrued.Add(1)
				a.log.Debug("attempt accounted", "session", id, "queueRevision", qr, "owner", acc.Owner, "team", acc.Team,
					"gpus", acc.GPUs, "gpuHours", float64(state.GPUMillis(acc.GPUs, acc.Bound, acc.Ended))/3.6e6)
			}
			return nil
		case errors.Is(err, state.ErrNotFound):
			a.late.Add(1)
			a.log.Warn("cannot account an ended attempt: its session was retired first", "session", id, "queueRevision", qr)
			return nil
		case errors.Is(err, state.ErrConflict) && try < 10:
			continue
		default:
			return err
		}
	}
}

func (a *Accountant) setApplied(rev int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.applied = max(a.applied, rev)
}

// writeCursor records that every change up to rev was handled.
func (a *Accountant) writeCursor(rev int64) {
	if rev <= 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := state.UsageCursor{Revision: rev, Updated: a.cfg.Now().UTC()}
	// Never backwards: an accrual may have written a later one.
	cur, modRev, err := state.Get[state.UsageCursor](ctx, a.cli, a.cfg.Keys.UsageCursor())
	if err != nil && !errors.Is(err, state.ErrNotFound) {
		a.log.Debug("read usage cursor", "err", err)
		return
	}
	if cur.Revision >= rev {
		return
	}
	v, err := state.Encode(c)
	if err != nil {
		return
	}
	if _, err := a.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(a.cfg.Keys.UsageCursor()), "=", modRev)).
		Then(clientv3.OpPut(a.cfg.Keys.UsageCursor(), v)).Commit(); err != nil {
		a.log.Debug("write usage cursor", "err", err)
	}
}

// sweepMarks deletes the accruals of retired sessions (SweepMarks) when
// this accountant is elected and every SweepEvery after, until ctx ends.
// It runs beside the watch, so a long sweep does not hold up accounting
// (which retention waits on); sweeping at election means an accountant
// restarted more often than SweepEvery still sweeps.
func (a *Accountant) sweepMarks(ctx context.Context) {
	tick := time.NewTicker(a.cfg.SweepEvery)
	defer tick.Stop()
	for {
		if n, err := a.SweepMarks(ctx); err != nil && ctx.Err() == nil {
			a.log.Warn("sweep accruals of retired sessions", "err", err)
		} else if n > 0 {
			a.log.Debug("swept accruals of retired sessions", "sessions", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// sweepBatch is how many sessions' accruals one SweepMarks transaction
// deletes: a compare and a ranged delete each, within etcd's default
// --max-txn-ops of 128.
const sweepBatch = 100

// SweepMarks deletes the accruals of sessions whose status is gone
// (retired) and returns how many sessions' it deleted. The daily records
// keep their GPU-time. Deleting is safe: state.Accrue counts nothing for a
// session whose status is gone, so a late replay cannot count it again,
// and each delete requires the status still absent. It reads the accruals'
// and the statuses' keys at one revision, so it tries only the sessions
// whose status was gone then, sweepBatch to a transaction (one by one in a
// batch that is refused, which a status written since can cause).
func (a *Accountant) SweepMarks(ctx context.Context) (int, error) {
	k := a.cfg.Keys
	resp, err := a.cli.Txn(ctx).Then(
		clientv3.OpGet(k.Accruals(), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(k.StatusDir(), clientv3.WithPrefix(), clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return 0, fmt.Errorf("list accruals and statuses: %w", err)
	}
	live := map[string]bool{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		if id, ok := k.SessionID(string(kv.Key)); ok {
			live[id] = true
		}
	}
	seen := map[string]bool{}
	var gone []string
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		id, _, ok := k.AccrualKey(string(kv.Key))
		if !ok || seen[id] || live[id] {
			continue
		}
		seen[id] = true
		gone = append(gone, id)
	}
	n := 0
	for b := 0; b < len(gone); b += sweepBatch {
		batch := gone[b:min(b+sweepBatch, len(gone))]
		swept, err := a.deleteMarks(ctx, batch)
		if err != nil {
			return n, err
		}
		if !swept {
			for _, id := range batch {
				one, err := a.deleteMarks(ctx, []string{id})
				if err != nil {
					return n, err
				}
				if one {
					n++
				}
			}
			continue
		}
		n += len(batch)
	}
	return n, nil
}

// deleteMarks deletes the accruals of sessions ids in one transaction
// that requires each one's status absent, and says whether it applied.
func (a *Accountant) deleteMarks(ctx context.Context, ids []string) (bool, error) {
	k := a.cfg.Keys
	cmps := make([]clientv3.Cmp, len(ids))
	ops := make([]clientv3.Op, len(ids))
	for i, id := range ids {
		cmps[i] = clientv3.Compare(clientv3.CreateRevision(k.Status(id)), "=", 0)
		ops[i] = clientv3.OpDelete(k.SessionAccruals(id), clientv3.WithPrefix())
	}
	r, err := a.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return false, fmt.Errorf("delete accruals of %d retired sessions: %w", len(ids), err)
	}
	return r.Succeeded, nil
}

// Collectors returns the accountant's Prometheus collectors: the attempts
// it counted and those it could not (their sessions retired first), the
// run times it learned, and the revision up to which it has handled every
// status change.
func (a *Accountant) Collectors() []prometheus.Collector {
	m := promfunc.Set{Subsystem: "usage"}
	return []prometheus.Collector{
		m.Counter("attempts_accrued_total", "Ended attempts this process's usage accountant counted into GPU-hours (accruals/, gpuhours/).", a.Accrued),
		m.Counter("attempts_late_total",
			"Ended attempts the usage accountant could not count: their sessions were retired (or their specs compacted away) before it saw them end.", a.Late),
		m.Counter("catch_ups_total",
			"Times this process's usage accountant counted from the statuses as listed (no cursor, or a cursor behind etcd's compaction) rather than change by change.", a.CatchUps),
		m.Counter("runtimes_learned_total",
			"Finished attempts whose run times this process's usage accountant added to their owners' records (runtimes/), from which placers estimate when sessions end.", a.Learned),
		m.Gauge("applied_revision", "The etcd revision up to which this process's usage accountant handled every status change (0 while it does not lead).",
			func() float64 { return float64(a.Applied()) }),
	}
}
