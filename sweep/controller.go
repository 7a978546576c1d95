package sweep

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/ctxwait"
	"github.com/voyager-gpu/voyager/internal/promfunc"
	"github.com/voyager-gpu/voyager/state"
)

// Config configures a Controller. Zero fields take the defaults named.
type Config struct {
	// Keys is the key schema. Default: state.DefaultPrefix.
	Keys state.Keys
	// Every is the longest time between two full passes over the
	// unfinished arrays; watch events start a pass over one array at
	// once. Default 10 seconds.
	Every time.Duration
	// Budget bounds one transaction. Default: etcd's defaults.
	Budget state.TxnBudget
	// Logger receives structured logs. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Controller creates the elements of job arrays within their caps,
// records their results and stops the elements of stopped arrays.
type Controller struct {
	cfg Config
	cli *clientv3.Client
	log *slog.Logger

	created, finished, stopped, conflicts, reconciles atomic.Int64
}

// New returns a controller over cli. It does nothing until Run.
func New(cli *clientv3.Client, cfg Config) *Controller {
	if cfg.Keys == (state.Keys{}) {
		cfg.Keys = state.MustKeys(state.DefaultPrefix)
	}
	if cfg.Every <= 0 {
		cfg.Every = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Controller{cfg: cfg, cli: cli, log: cfg.Logger.With("component", "sweep")}
}

// Stats are the controller's counters.
type Stats struct {
	// Created counts elements created; Finished results recorded;
	// Stopped stops asked of elements of stopped arrays.
	Created, Finished, Stopped int64
	// Conflicts counts writes refused because the array moved since read.
	Conflicts int64
	// Reconciles counts calls of Reconcile (each reads the array).
	Reconciles int64
}

// Stats returns the controller's counters.
func (c *Controller) Stats() Stats {
	return Stats{Created: c.created.Load(), Finished: c.finished.Load(), Stopped: c.stopped.Load(), Conflicts: c.conflicts.Load(),
		Reconciles: c.reconciles.Load()}
}

// Collectors returns the controller's Prometheus metrics.
func (c *Controller) Collectors() []prometheus.Collector {
	m := promfunc.Set{Subsystem: "sweep"}
	return []prometheus.Collector{
		m.Counter("elements_created_total", "Array elements created by this process.", c.created.Load),
		m.Counter("elements_finished_total", "Finished array elements whose result this process recorded.", c.finished.Load),
		m.Counter("element_stops_total", "Stops of elements of stopped arrays asked by this process.", c.stopped.Load),
		m.Counter("conflicts_total", "Array writes refused because the array changed since read.", c.conflicts.Load),
		m.Counter("reconciles_total", "Reconciles of one array (each reads the array and its elements' statuses).", c.reconciles.Load),
	}
}

// Run reconciles every unfinished array, then each array whose record or
// element statuses change, and all of them again every Config.Every,
// until ctx ends. It returns nil then.
func (c *Controller) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		rev, err := c.ReconcileAll(ctx)
		if err == nil {
			err = c.follow(ctx, rev)
		}
		if ctx.Err() != nil {
			return nil
		}
		c.log.Warn("array controller: relisting", "err", err)
		if !ctxwait.Sleep(ctx, time.Second) {
			return nil
		}
	}
	return nil
}

// follow watches arrays and statuses after rev and reconciles the arrays
// they touch, with a full pass every Config.Every. It returns on a watch
// failure (the caller relists) or when ctx ends.
func (c *Controller) follow(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	k := c.cfg.Keys
	arrays := c.cli.Watch(wctx, k.Arrays(), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	statuses := c.cli.Watch(wctx, k.StatusDir(), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	tick := time.NewTicker(c.cfg.Every)
	defer tick.Stop()
	for {
		var resp clientv3.WatchResponse
		var ok bool
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if _, err := c.ReconcileAll(ctx); err != nil {
				return err
			}
			continue
		case resp, ok = <-arrays:
		case resp, ok = <-statuses:
		}
		if !ok {
			return errors.New("watch arrays: the watch ended")
		}
		if err := resp.Err(); err != nil {
			return fmt.Errorf("watch arrays: %w", err)
		}
		dirty := map[string]bool{}
		for _, ev := range resp.Events {
			if id, ok := c.arrayOf(string(ev.Kv.Key)); ok && c.matters(ev) {
				dirty[id] = true
			}
		}
		for id := range dirty {
			if err := c.Reconcile(ctx, id); err != nil && ctx.Err() == nil {
				c.log.Warn("reconcile array", "array", id, "err", err)
			}
		}
	}
}

// matters reports whether a change under arrays/ or status/ can move
// its array: any change of the record, and an element's status that
// ended or went (retired). An element bound, started or re-queued changes
// nothing a reconcile decides (the results, the elements below the cap,
// the array's end, the stops), and was read and decided about in vain: a
// reconcile a status change, about four an element.
func (c *Controller) matters(ev *clientv3.Event) bool {
	if _, ok := c.cfg.Keys.ArrayID(string(ev.Kv.Key)); ok || ev.Type == clientv3.EventTypeDelete {
		return true
	}
	st, err := state.Decode[state.Status](ev.Kv.Value)
	return err != nil || st.Phase.Terminal()
}

// arrayOf names the array a key under arrays/ or status/ belongs to.
func (c *Controller) arrayOf(key string) (string, bool) {
	k := c.cfg.Keys
	if id, ok := k.ArrayID(key); ok {
		return id, true
	}
	sid, ok := k.SessionID(key)
	if !ok || !strings.HasPrefix(key, k.StatusDir()) {
		return "", false
	}
	id, _, ok := state.ElementOf(sid)
	return id, ok
}

// ReconcileAll reconciles every unfinished array and returns the
// revision it listed them at.
func (c *Controller) ReconcileAll(ctx context.Context) (int64, error) {
	resp, err := c.cli.Get(ctx, c.cfg.Keys.Arrays(), clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("list arrays: %w", err)
	}
	for _, kv := range resp.Kvs {
		a, err := state.Decode[state.Array](kv.Value)
		if err != nil || a.Finished != nil {
			continue
		}
		if err := c.Reconcile(ctx, a.ID); err != nil && ctx.Err() == nil {
			c.log.Warn("reconcile array", "array", a.ID, "err", err)
		}
	}
	return resp.Header.Revision, nil
}

// maxAttempts bounds Reconcile's read-decide-write rounds.
const maxAttempts = 8

// Reconcile brings array id one step nearer its goal: results of newly
// finished elements recorded, elements created up to the cap (none once
// stopped), the array marked finished when the last element ended, and,
// once stopped, every unfinished element asked to stop.
func (c *Controller) Reconcile(ctx context.Context, id string) error {
	c.reconciles.Add(1)
	for attempt := 0; attempt < maxAttempts; attempt++ {
		err := c.step(ctx, id)
		if !errors.Is(err, state.ErrConflict) {
			return err
		}
		c.conflicts.Add(1)
	}
	return fmt.Errorf("reconcile array %s: still changing after %d attempts", id, maxAttempts)
}

// step is one read-decide-write round of Reconcile.
func (c *Controller) step(ctx context.Context, id string) error {
	k := c.cfg.Keys
	// The record and its elements' statuses at one revision: every
	// element below Next was created with its status in the transaction
	// that raised Next, so a missing status is a retired one.
	resp, err := c.cli.Txn(ctx).Then(
		clientv3.OpGet(k.Array(id)),
		clientv3.OpGet(k.Status(id+"-"), clientv3.WithPrefix()),
		clientv3.OpGet(k.SpecSecrets(id)),
	).Commit()
	if err != nil {
		return fmt.Errorf("read array %s: %w", id, err)
	}
	akv := resp.Responses[0].GetResponseRange().Kvs
	if len(akv) == 0 {
		return nil
	}
	a, err := state.Decode[state.Array](akv[0].Value)
	if err != nil {
		return fmt.Errorf("read array %s: %w", id, err)
	}
	rev := akv[0].ModRevision
	if a.Finished != nil {
		return nil
	}
	ix, err := state.ParseIndexSet(a.Indices)
	if err != nil {
		return fmt.Errorf("read array %s: %w", id, err)
	}
	statuses := map[int]state.Status{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		sid, _ := k.SessionID(string(kv.Key))
		n, ok := state.ElementIndex(id, sid)
		if !ok {
			continue
		}
		if st, err := state.Decode[state.Status](kv.Value); err == nil {
			statuses[n] = st
		}
	}
	now := c.cfg.Now().UTC()
	next := a
	next.Done = maps.Clone(a.Done)
	if next.Done == nil {
		next.Done = map[string]state.ElementResult{}
	}
	var toStop []string
	finished := 0
	for pos := 0; pos < a.Next && pos < len(ix); pos++ {
		n := ix[pos]
		key := strconv.Itoa(n)
		if _, done := next.Done[key]; done {
			continue
		}
		st, ok := statuses[n]
		switch {
		case !ok:
			next.Done[key] = state.ElementResult{Reason: "Retired"}
			finished++
		case st.Phase.Terminal():
			next.Done[key] = state.ResultOf(st)
			finished++
		case a.Stop != nil:
			toStop = append(toStop, state.ElementID(id, n))
		}
	}
	var create []state.Session
	if a.Stop == nil {
		limit := a.MaxRunning
		if limit <= 0 {
			limit = len(ix)
		}
		room := min(limit-(a.Next-len(next.Done)), len(ix)-a.Next)
		tmpl, err := templateWithSecrets(a, resp.Responses[2].GetResponseRange().Kvs)
		if err != nil {
			return err
		}
		create = c.fit(&next, tmpl, ix, room, now)
	}
	if next.Next-len(next.Done) == 0 && (next.Next == len(ix) || next.Stop != nil) {
		next.Finished = &now
	}
	if finished > 0 || len(create) > 0 || next.Finished != nil {
		if len(next.Done) == 0 {
			next.Done = nil
		}
		if err := state.AdvanceArray(ctx, c.cli, k, next, rev, create, now); err != nil {
			return err
		}
		c.created.Add(int64(len(create)))
		c.finished.Add(int64(finished))
		if len(create) > 0 {
			c.log.Debug("array elements created", "array", id, "created", len(create), "next", next.Next, "of", len(ix))
		}
		if next.Finished != nil {
			c.log.Info("array finished", "array", id, "elements", len(ix), "created", next.Next)
		}
	}
	for _, sid := range toStop {
		out, err := state.StopSession(ctx, c.cli, k, sid, "the stop of array "+id, now)
		if err != nil && !errors.Is(err, state.ErrNotFound) {
			return fmt.Errorf("stop element %s: %w", sid, err)
		}
		if out != state.StopAlready {
			c.stopped.Add(1)
		}
	}
	return nil
}

// templateWithSecrets is a's element template with its environment values
// joined back from the array's secrets record (kvs, the read of
// specsecrets/<id>); AdvanceArray moves each element's out of its spec
// again.
func templateWithSecrets(a state.Array, kvs []*mvccpb.KeyValue) (state.Session, error) {
	if !a.Template.SecretEnv {
		return a.Template, nil
	}
	if len(kvs) == 0 {
		return state.Session{}, fmt.Errorf("array %s: its template's environment values (specsecrets/%s) are missing", a.ID, a.ID)
	}
	sec, err := state.Decode[state.SpecSecrets](kvs[0].Value)
	if err != nil {
		return state.Session{}, fmt.Errorf("read secrets of array %s: %w", a.ID, err)
	}
	t := state.JoinSpecSecrets(a.Template, sec)
	t.SecretEnv = false
	return t, nil
}

// fit builds up to room elements from position a.Next on, from template
// tmpl (a's, with its secrets), as many as one transaction holds with a's
// record, and advances a.Next past them.
func (c *Controller) fit(a *state.Array, tmpl state.Session, ix []int, room int, now time.Time) []state.Session {
	if room <= 0 {
		return nil
	}
	rec, err := state.Encode(*a)
	if err != nil {
		return nil
	}
	bytes := len(rec) + 64
	var out []state.Session
	el := *a
	el.Template = tmpl
	for pos := a.Next; pos < a.Next+room; pos++ {
		s := el.Element(ix, pos, now)
		spec, err := state.Encode(s)
		if err != nil {
			break
		}
		// Spec, queue entry and status: the spec (with its environment
		// values) bounds each, and its secrets record (values and a Ray
		// session's token).
		_, sec := state.SplitSpecSecrets(s)
		secrets := sec != nil || s.Ray != nil && s.Ray.Workers > 0
		b := bytes + 3*len(spec) + 3*len(c.cfg.Keys.Session(s.ID))
		if secrets {
			b += len(spec) + 128
		}
		if !c.cfg.Budget.Fits(state.ArrayStepSize(len(out)+1, b, secrets)) {
			break
		}
		bytes = b
		out = append(out, s)
	}
	a.Next += len(out)
	return out
}
