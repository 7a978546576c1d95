package lifecycle

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/promfunc"
	"github.com/voyager-gpu/voyager/state"
)

// RetentionConfig configures Retention. Zero fields take the defaults.
type RetentionConfig struct {
	// Keys is the key schema. Default: state.DefaultPrefix.
	Keys state.Keys
	// After is how long a finished session stays in etcd. Default 7 days.
	After time.Duration
	// AccrualWait is how much longer than After a finished session whose
	// last bound attempt the usage accountant has not recorded yet
	// (accruals/<id>/<queueRevision> absent) stays, waiting for it. Past
	// it the session is retired anyway and that attempt's GPU-hours are
	// lost (logged at warn, counted in UnaccountedRetired), so a stopped
	// accountant does not keep sessions in etcd forever. Default 24 hours.
	AccrualWait time.Duration
	// HistoryPath is the append-only history file (JSON lines). Required.
	HistoryPath string
	// Every is the time between sweeps. Default 1 minute.
	Every time.Duration
	// Batch is how many sessions one delete transaction removes (five
	// keys each: spec, status, any warning, any secrets record and any
	// Ray token of an older session, so at most a fifth of etcd's
	// --max-txn-ops). Default 25.
	Batch int
	// Logger receives structured logs. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// maxChunk bounds how many records one sweep holds in memory and appends
// with one fsync.
const maxChunk = 10000

// HistoryRecord is one line of the history file: a session's final spec
// and status, or a job array's final record, and when it left etcd.
type HistoryRecord struct {
	Session state.Session `json:"session,omitzero"`
	Status  state.Status  `json:"status,omitzero"`
	// Array, on a line of its own, is a retired job array's record: every
	// element's result, the template, the stop.
	Array   *state.Array `json:"array,omitempty"`
	Retired time.Time    `json:"retired"`
}

// Retention moves finished sessions and finished job arrays from etcd to
// the history file.
type Retention struct {
	cfg RetentionConfig
	cli *clientv3.Client
	log *slog.Logger

	mu      sync.Mutex // serialises sweeps and history writes
	retired int64
	arrays  int64
	// unaccounted counts the sessions retired without their last
	// attempt's accrual (AccrualWait passed); awaiting is how many due
	// sessions the last sweep kept for the accountant.
	unaccounted int64
	awaiting    int
}

// NewRetention returns a retention sweeper over cli.
func NewRetention(cli *clientv3.Client, cfg RetentionConfig) (*Retention, error) {
	if cfg.HistoryPath == "" {
		return nil, errors.New("configure retention: no history file; set a path for the finished sessions' records")
	}
	if cfg.Keys == (state.Keys{}) {
		cfg.Keys = state.MustKeys(state.DefaultPrefix)
	}
	if cfg.After <= 0 {
		cfg.After = 7 * 24 * time.Hour
	}
	if cfg.Every <= 0 {
		cfg.Every = time.Minute
	}
	if cfg.AccrualWait <= 0 {
		cfg.AccrualWait = 24 * time.Hour
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 25
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Retention{cfg: cfg, cli: cli, log: cfg.Logger.With("component", "retention")}, nil
}

// Retired returns how many sessions this sweeper moved to history.
func (r *Retention) Retired() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.retired
}

// RetiredArrays returns how many job arrays this sweeper moved to history.
func (r *Retention) RetiredArrays() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.arrays
}

// UnaccountedRetired returns how many sessions this sweeper retired
// without their last bound attempt's accrual: the usage accountant had not
// recorded it AccrualWait past After, and now never will.
func (r *Retention) UnaccountedRetired() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.unaccounted
}

// AwaitingAccrual returns how many finished sessions, due to leave, the
// last sweep kept because the usage accountant had not recorded their
// last bound attempt yet.
func (r *Retention) AwaitingAccrual() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.awaiting
}

// Run sweeps every Every while this process holds the retention election,
// until ctx ends. It returns nil when ctx is cancelled.
func (r *Retention) Run(ctx context.Context) error {
	leadUntilDone(ctx, r.cli, r.cfg.Keys, "retention", r.log, r.lead)
	return nil
}

// lead sweeps every Every until ctx ends.
func (r *Retention) lead(ctx context.Context) error {
	r.log.Debug("retention sweeper elected", "after", r.cfg.After, "history", r.cfg.HistoryPath)
	tick := time.NewTicker(r.cfg.Every)
	defer tick.Stop()
	for {
		if _, err := r.Sweep(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("retention sweep failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Sweep moves every session finished more than After ago to the history
// file and deletes its keys, and returns how many it moved. For each batch
// it appends and fsyncs the records first, then deletes the keys in one
// transaction that applies only if each status is unchanged since read. A
// crash between the two leaves the session in etcd and its record in the
// file: the next sweep appends it again, so the history may hold a record
// twice (identical; readers keep the last per session) but never loses one.
//
// A job array finished more than After ago leaves with its elements: the
// elements still in etcd are retired in the same batches as the sessions
// (whatever their own end, which is no later than the array's), then the
// array's record is appended and deleted by state.RetireArray, which
// compares the record's revision and that no element is left. An array
// whose elements could not all be deleted waits for the next sweep.
//
// A session whose status shows a bound attempt that ended (a bound time
// and queue revision, state.EndedStatus) leaves only once the usage
// accountant recorded that attempt: its delete transaction compares that
// accruals/<id>/<queueRevision> exists, because state.Accrue refuses to
// count a session whose status is gone. The accountant records a
// session's attempts in the order of their ends, so the last one's accrual
// vouches for the earlier ones. A session still without it AccrualWait
// past its due time (the accountant stopped, or could not count it) is
// retired without it, logged at warn and counted (UnaccountedRetired).
func (r *Retention) Sweep(ctx context.Context) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cutoff := r.cfg.Now().Add(-r.cfg.After)
	arrays, err := r.dueArrays(ctx, cutoff)
	if err != nil {
		return 0, err
	}
	todo, err := r.dueSessions(ctx, cutoff, arrays)
	if err != nil {
		return 0, err
	}
	if todo, err = r.accounted(ctx, todo, cutoff.Add(-r.cfg.AccrualWait)); err != nil {
		return 0, err
	}
	moved := 0
	// A chunk's records are appended and fsynced once, then its keys are
	// deleted a transaction (Batch sessions) at a time.
	for start := 0; start < len(todo); start += maxChunk {
		n, err := r.retireChunk(ctx, todo[start:min(start+maxChunk, len(todo))])
		moved += n
		if err != nil {
			return moved, err
		}
	}
	if moved > 0 {
		r.log.Info("retired finished sessions", "sessions", moved, "older_than", r.cfg.After)
	}
	if err := r.retireArrays(ctx, arrays); err != nil {
		return moved, err
	}
	return moved, nil
}

// dueSession is a finished session to retire: its status and the
// revision it was read at.
type dueSession struct {
	id  string
	st  state.Status
	rev int64
	// accrual is the key of the accrual of the bound attempt the status
	// shows ended ("" when it shows none); unaccounted says the session
	// leaves without it (AccrualWait passed).
	accrual     string
	unaccounted bool
}

// dueSessions lists, by id, the sessions that finished before cutoff and
// the elements of the due arrays, from the statuses at one revision.
func (r *Retention) dueSessions(ctx context.Context, cutoff time.Time, arrays map[string]dueArray) ([]dueSession, error) {
	k := r.cfg.Keys
	var todo []dueSession
	err := r.listPaged(ctx, k.StatusDir(), 1000, func(kv *mvccpb.KeyValue) {
		st, err := state.Decode[state.Status](kv.Value)
		if err != nil || !st.Phase.Terminal() {
			return
		}
		finished := finishedAt(st)
		id, ok := k.SessionID(string(kv.Key))
		if !ok {
			return
		}
		arr, _, element := state.ElementOf(id)
		if _, arrayDue := arrays[arr]; finished.Before(cutoff) || (element && arrayDue) {
			d := dueSession{id: id, st: st, rev: kv.ModRevision}
			if qr, _, _, _, ok := state.EndedStatus(st); ok {
				d.accrual = k.Accrual(id, qr)
			}
			todo = append(todo, d)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("list statuses: %w", err)
	}
	sort.Slice(todo, func(i, j int) bool { return todo[i].id < todo[j].id })
	return todo, nil
}

// retireChunk appends the records of chunk's sessions to the history
// file, then deletes their keys Batch sessions a transaction, each
// transaction conditional on the statuses being unchanged. It returns how
// many it deleted.
func (r *Retention) retireChunk(ctx context.Context, chunk []dueSession) (int, error) {
	records, err := r.records(ctx, chunk)
	if err != nil {
		return 0, err
	}
	if err := r.appendHistory(records); err != nil {
		return 0, err
	}
	k := r.cfg.Keys
	moved := 0
	for b := 0; b < len(chunk); b += r.cfg.Batch {
		batch := chunk[b:min(b+r.cfg.Batch, len(chunk))]
		cmps := make([]clientv3.Cmp, 0, len(batch))
		ops := make([]clientv3.Op, 0, 5*len(batch))
		for _, d := range batch {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k.Status(d.id)), "=", d.rev))
			if d.accrual != "" && !d.unaccounted {
				cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(d.accrual), ">", 0))
			}
			ops = append(ops, clientv3.OpDelete(k.Session(d.id)), clientv3.OpDelete(k.Status(d.id)), clientv3.OpDelete(k.Warning(d.id)),
				clientv3.OpDelete(k.SpecSecrets(d.id)), clientv3.OpDelete(k.RayToken(d.id)))
		}
		resp, err := r.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return moved, fmt.Errorf("delete retired sessions: %w", err)
		}
		if !resp.Succeeded {
			// A status changed under us (rare: a finished session does
			// not change). Its record is in the file; the next sweep
			// re-reads and retires it.
			r.log.Info("retired batch changed concurrently; retrying next sweep", "sessions", len(batch))
			continue
		}
		moved += len(batch)
		r.retired += int64(len(batch))
		for _, d := range batch {
			if d.unaccounted {
				r.unaccounted++
				r.log.Warn("retired a session whose last bound attempt the usage accountant never recorded: its GPU-hours are lost",
					"session", d.id, "accrual", d.accrual, "waited", r.cfg.AccrualWait)
			}
		}
	}
	return moved, nil
}

// accounted returns the sessions of todo that may leave now: those whose
// status shows no ended bound attempt or whose attempt the usage
// accountant recorded (its accrual exists), and those that finished before
// giveUp without it (marked unaccounted). It reads the accruals a Batch at
// a time, and counts the sessions it keeps (AwaitingAccrual).
func (r *Retention) accounted(ctx context.Context, todo []dueSession, giveUp time.Time) ([]dueSession, error) {
	out := todo[:0:0]
	awaiting := 0
	for b := 0; b < len(todo); b += r.cfg.Batch {
		batch := todo[b:min(b+r.cfg.Batch, len(todo))]
		var gets []clientv3.Op
		for _, d := range batch {
			if d.accrual != "" {
				gets = append(gets, clientv3.OpGet(d.accrual, clientv3.WithCountOnly()))
			}
		}
		var resp *clientv3.TxnResponse
		if len(gets) > 0 {
			var err error
			if resp, err = r.cli.Txn(ctx).Then(gets...).Commit(); err != nil {
				return nil, fmt.Errorf("read accruals of retired sessions: %w", err)
			}
		}
		i := 0
		for _, d := range batch {
			if d.accrual == "" {
				out = append(out, d)
				continue
			}
			recorded := resp.Responses[i].GetResponseRange().Count > 0
			i++
			switch {
			case recorded:
			case finishedAt(d.st).Before(giveUp):
				d.unaccounted = true
			default:
				awaiting++
				continue
			}
			out = append(out, d)
		}
	}
	if awaiting > 0 {
		r.log.Debug("finished sessions wait for the usage accountant to record their last attempt", "sessions", awaiting)
	}
	r.awaiting = awaiting
	return out, nil
}

// finishedAt is when a finished status ended: its finished time, or its
// last update.
func finishedAt(st state.Status) time.Time {
	if st.Finished != nil {
		return *st.Finished
	}
	return st.Updated
}

// Collectors returns the sweeper's Prometheus collectors: the sessions and
// job arrays it retired, those retired without their last attempt's
// GPU-hours, and the due sessions waiting for the usage accountant.
func (r *Retention) Collectors() []prometheus.Collector {
	m := promfunc.Set{Subsystem: "retention"}
	return []prometheus.Collector{
		m.Counter("sessions_retired_total", "Finished sessions this process's retention sweeper moved from etcd to the history file.", r.Retired),
		m.Counter("arrays_retired_total", "Finished job arrays this process's retention sweeper moved from etcd to the history file.", r.RetiredArrays),
		m.Counter("sessions_unaccounted_total",
			"Finished sessions retired without the usage accountant's record of their last bound attempt (it had not recorded it VOYAGER_RETENTION_ACCRUAL_WAIT past their retention): those GPU-hours are lost.",
			r.UnaccountedRetired),
		m.Gauge("sessions_awaiting_accrual", "Finished sessions due to leave etcd that the last sweep kept because the usage accountant had not recorded their last bound attempt yet.",
			func() float64 { return float64(r.AwaitingAccrual()) }),
	}
}

// records reads the specs of chunk's sessions, one round trip a Batch,
// and returns their history records (a spec already gone: its id only).
func (r *Retention) records(ctx context.Context, chunk []dueSession) ([]HistoryRecord, error) {
	now := r.cfg.Now().UTC()
	records := make([]HistoryRecord, 0, len(chunk))
	for b := 0; b < len(chunk); b += r.cfg.Batch {
		batch := chunk[b:min(b+r.cfg.Batch, len(chunk))]
		gets := make([]clientv3.Op, len(batch))
		for i, d := range batch {
			gets[i] = clientv3.OpGet(r.cfg.Keys.Session(d.id))
		}
		specs, err := r.cli.Txn(ctx).Then(gets...).Commit()
		if err != nil {
			return nil, fmt.Errorf("read retired specs: %w", err)
		}
		kvs := state.FirstKVs(specs)
		for i, d := range batch {
			spec := state.Session{ID: d.id}
			if kvs[i] != nil {
				if v, err := state.Decode[state.Session](kvs[i].Value); err == nil {
					spec = v
				}
			}
			records = append(records, HistoryRecord{Session: spec, Status: d.st, Retired: now})
		}
	}
	return records, nil
}

// dueArray is a job array to retire: its record and the revision it was
// read at.
type dueArray struct {
	a   state.Array
	rev int64
}

// dueArrays lists the job arrays that finished before cutoff, by id.
func (r *Retention) dueArrays(ctx context.Context, cutoff time.Time) (map[string]dueArray, error) {
	out := map[string]dueArray{}
	// Records hold every element's result: page them in hundreds.
	err := r.listPaged(ctx, r.cfg.Keys.Arrays(), 100, func(kv *mvccpb.KeyValue) {
		a, err := state.Decode[state.Array](kv.Value)
		if err == nil && a.Finished != nil && a.Finished.Before(cutoff) {
			out[a.ID] = dueArray{a: a, rev: kv.ModRevision}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("list arrays: %w", err)
	}
	return out, nil
}

// listPaged calls each with every key under prefix, read limit keys at a
// time, all at the revision of the first read.
func (r *Retention) listPaged(ctx context.Context, prefix string, limit int64, each func(*mvccpb.KeyValue)) error {
	key, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
	var rev int64
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(limit)}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := r.cli.Get(ctx, key, opts...)
		if err != nil {
			return err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			each(kv)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// retireArrays appends the records of arrays to the history file, then
// deletes each whose elements are all gone (state.RetireArray).
func (r *Retention) retireArrays(ctx context.Context, arrays map[string]dueArray) error {
	if len(arrays) == 0 {
		return nil
	}
	ids := slices.Sorted(maps.Keys(arrays))
	now := r.cfg.Now().UTC()
	records := make([]HistoryRecord, len(ids))
	for i, id := range ids {
		a := arrays[id].a
		records[i] = HistoryRecord{Array: &a, Retired: now}
	}
	if err := r.appendHistory(records); err != nil {
		return err
	}
	retired := 0
	for _, id := range ids {
		err := state.RetireArray(ctx, r.cli, r.cfg.Keys, id, arrays[id].rev)
		switch {
		case errors.Is(err, state.ErrConflict):
			// An element was not deleted (its batch changed under us):
			// the array's record is in the file; the next sweep retires
			// the rest and it.
			r.log.Info("finished array still has elements; retrying next sweep", "array", id)
		case err != nil:
			return err
		default:
			retired++
		}
	}
	r.arrays += int64(retired)
	if retired > 0 {
		r.log.Info("retired finished arrays", "arrays", retired, "older_than", r.cfg.After)
	}
	return nil
}

// appendHistory appends records as JSON lines and fsyncs the file.
func (r *Retention) appendHistory(records []HistoryRecord) error {
	if err := os.MkdirAll(filepath.Dir(r.cfg.HistoryPath), 0o700); err != nil {
		return fmt.Errorf("create history directory: %w", err)
	}
	f, err := os.OpenFile(r.cfg.HistoryPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open history file: %w", err)
	}
	w := bufio.NewWriter(f)
	for _, rec := range records {
		line, err := state.Encode(rec)
		if err != nil {
			_ = f.Close()
			return err
		}
		if _, err := w.WriteString(line + "\n"); err != nil {
			_ = f.Close()
			return fmt.Errorf("write history: %w", err)
		}
	}
	if err := w.Flush(); err != nil {
		_ = f.Close()
		return fmt.Errorf("write history: %w", err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("sync history: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close history: %w", err)
	}
	return nil
}
