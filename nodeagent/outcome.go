package nodeagent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/ctxwait"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// outcome is how a session ends on this node: the final status's phase,
// reason and message, and RetryAt when it waits to run again (Phase
// Pending after a restart back-off or a preemption).
type outcome struct {
	phase   state.Phase
	reason  string
	msg     string
	retryAt *time.Time
}

// decider chooses the outcome from the session's spec and current status,
// read afresh on each attempt of the release and compared by its
// transaction; an error retries it.
type decider func(spec state.Session, cur *state.PartStatus) (outcome, error)

func fixed(o outcome) decider {
	return func(state.Session, *state.PartStatus) (outcome, error) { return o, nil }
}

// exited records the end of a container that stopped by itself, releases
// the binding and removes the container.
func (w *worker) exited(ctx context.Context, sess state.Session, r exitResult, stopReq chan struct{}) {
	if why, ok := w.a.fencedWhy(w.id); ok {
		// Killed by a fence (the keeper's, while this agent could not
		// renew), not an exit of the session's own.
		w.fencedEnd(ctx, why)
		return
	}
	code := r.code
	msg := "exited with code " + strconv.Itoa(code)
	if code < 0 {
		msg = "the container is gone and its exit code unknown (containerd restarted?)"
	}
	// The output stays in the log (status.urls.logs, for the owner): a
	// status is read by more than its owner, so it never carries output.
	var decide decider
	switch {
	case code == 0 && sess.Kind == state.KindBatch:
		decide = fixed(outcome{phase: state.PhaseSucceeded, reason: "Exited", msg: msg})
	case code == 0:
		decide = fixed(outcome{phase: state.PhaseStopped, reason: "Exited", msg: msg})
	default:
		decide = w.failed(sess, stopReq, "Exited", msg)
	}
	w.log.Info("container exited", "code", code)
	if !w.finish(ctx, &code, decide) {
		return // not released: the container keeps its exit code for the next worker
	}
	w.a.removeContainer(context.WithoutCancel(ctx), w.id)
}

// failed decides the end of a session that failed (exited non-zero, or
// could not start): Failed; or, for a batch session with restart policy
// OnFailure and restarts left that nobody stopped or evicted, Pending with
// reason BackOff until RetryAt, when the lifecycle controller re-queues it
// and counts the attempt (the agent never does).
func (w *worker) failed(sess state.Session, stopReq chan struct{}, reason, msg string) decider {
	return func(spec state.Session, cur *state.PartStatus) (outcome, error) {
		delay, ok := w.restartDelay(spec, stopReq, cur.Attempt)
		if !ok {
			return outcome{phase: state.PhaseFailed, reason: reason, msg: msg}, nil
		}
		at := time.Now().UTC().Add(delay)
		return outcome{
			phase: state.PhasePending, reason: state.ReasonBackOff, retryAt: &at,
			msg: fmt.Sprintf("%s; restart %d of %d in %s", msg, cur.Attempt+1, sess.Restart.MaxRestarts, delay),
		}, nil
	}
}

// restartDelay reports whether a failed session restarts after attempt
// restarts, and after how long: Restart.Backoff (else the agent's
// RestartBackoff) doubled per restart, at most RestartBackoffMax. spec is
// the spec the release compares: a session stopped or evicted as it
// failed never comes back, even if the watch lags.
func (w *worker) restartDelay(spec state.Session, stopReq chan struct{}, attempt int) (time.Duration, bool) {
	cfg := w.a.cfg
	if spec.Kind != state.KindBatch || !spec.RestartsLeft(attempt) || spec.Stopping() {
		return 0, false
	}
	select {
	case <-stopReq:
		return 0, false
	default:
	}
	return RestartDelay(spec.Restart.Backoff.Std(), cfg.RestartBackoff, cfg.RestartBackoffMax, attempt), true
}

// RestartDelay is the wait before restart number attempt+1 of a failed
// OnFailure session: backoff (else def) doubled attempt times, at most max.
func RestartDelay(backoff, def, max time.Duration, attempt int) time.Duration {
	d := backoff
	if d <= 0 {
		d = def
	}
	for i := 0; i < attempt && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

// stop ends a session that is to stop (Session.Stopping): SIGTERM, grace,
// SIGKILL, then the release, then removal. The final status says why: the
// owner's stop (Stopped, StopRequested), or the eviction's reason and
// message (Stopped; Failed for a batch session past its max runtime, as
// Kubernetes' DeadlineExceeded; Pending, Preempted and RetryAt now when the
// eviction re-queues it).
func (w *worker) stop(ctx context.Context) {
	cfg := w.a.cfg
	sess := w.stopWith
	ev := sess.Eviction
	if sess.Desired == state.DesiredStopped {
		ev = nil // the owner's stop wins: never re-queued
	}
	reason, msg := "StopRequested", "stopping"
	if ev != nil {
		reason, msg = ev.Reason, "stopping: "+ev.Message
	}
	report := func() {
		w.setPart(ctx, state.EventStop, func(st *state.PartStatus) {
			st.Reason, st.Message = reason, msg
		})
	}
	// Stopping is reported only by a stop that takes longer than
	// StopReportAfter; one done sooner is reported by its end alone (the
	// state machine's Halt, Fail, Preempt and Resize leave any live
	// phase).
	var stopErr error
	if cfg.StopReportAfter < 0 {
		report()
		stopErr = cfg.Runtime.Stop(ctx, w.id, cfg.StopGrace)
	} else {
		stopped := make(chan error, 1)
		go func() { stopped <- cfg.Runtime.Stop(ctx, w.id, cfg.StopGrace) }()
		t := time.NewTimer(cfg.StopReportAfter)
		select {
		case stopErr = <-stopped:
		case <-t.C:
			report()
			stopErr = <-stopped
		}
		t.Stop()
	}
	var code *int
	if err := stopErr; err == nil {
		if in, err := cfg.Runtime.Status(ctx, w.id); err == nil && in.ExitCode >= 0 {
			code = &in.ExitCode
		}
	} else if !errors.Is(err, runtime.ErrNotFound) {
		w.log.Warn("stop container", "err", err)
		if ctx.Err() != nil {
			return
		}
	}
	decide := func(spec state.Session, _ *state.PartStatus) (outcome, error) {
		o := outcome{phase: state.PhaseStopped, reason: "StopRequested", msg: "stopped on request"}
		ev := ev
		if spec.Desired == state.DesiredStopped {
			// The owner's stop, also one that landed during the
			// eviction's grace, wins: never re-queued.
			ev = nil
		}
		switch {
		case ev == nil:
		case ev.Requeue:
			now := time.Now().UTC()
			o = outcome{phase: state.PhasePending, reason: state.ReasonPreempted, msg: cmp.Or(ev.Message, "preempted") + "; re-queued", retryAt: &now}
			if ev.Reason == state.ReasonResized {
				// An elastic job's resize: it runs again at its new size.
				o.reason, o.msg = state.ReasonResized, cmp.Or(ev.Message, "resized")+"; re-queued at its new size"
			}
		default:
			o = outcome{phase: state.PhaseStopped, reason: ev.Reason, msg: cmp.Or(ev.Message, ev.Reason)}
			if sess.Kind == state.KindBatch && ev.Reason == state.ReasonMaxRuntime {
				o.phase = state.PhaseFailed
			}
		}
		w.log.Info("session stopped", "phase", o.phase, "reason", o.reason)
		return o, nil
	}
	if !w.finish(ctx, code, decide) {
		return
	}
	w.a.removeContainer(context.WithoutCancel(ctx), w.id)
}

// finish writes how the part ended, as decide chooses, and releases the
// binding and the ledger allocation in one transaction (state.Release),
// retrying until it succeeds or ctx ends. The part goes to
// parts/<node>/<id>; the placers' status merger folds it into the
// session's status (state.MergeParts). A Pending outcome (waiting to run
// again) is not finished: no Finished time, and the Jupyter URL and
// activity of the gone container are dropped. A binding that is gone or
// replaced (state.ErrStale) has nothing left to release: a node loss took
// it, or this release committed and its reply was lost.
func (w *worker) finish(ctx context.Context, code *int, decide decider) bool {
	cfg := w.a.cfg
	b := w.item.Value
	final := func(spec state.Session, cur state.PartStatus) (state.Event, state.PartStatus, error) {
		o, err := decide(spec, &cur)
		if err != nil {
			return "", cur, err
		}
		ev, err := state.EventOf(o.phase, o.reason)
		if err != nil {
			return "", cur, err
		}
		now := time.Now().UTC()
		cur.Reason, cur.Message, cur.ExitCode, cur.Updated = o.reason, o.msg, code, now
		if cur.Started == nil && !w.started.IsZero() {
			// Ended before it was reported Running (RunReportAfter):
			// the end carries the start.
			started := w.started
			cur.Started = &started
		}
		cur.Finished, cur.RetryAt = &now, nil
		if o.phase == state.PhasePending {
			cur.Finished, cur.RetryAt, cur.Activity = nil, o.retryAt, nil
			delete(cur.URLs, "jupyter")
		}
		// The log outlives the container: a job that ended before
		// anyone saw it run can still be read.
		if logs, _ := w.a.logsURL(w.id); logs != "" && (b.Role != state.RoleWorker || w.jobWorker) {
			if cur.URLs == nil {
				cur.URLs = map[string]string{}
			}
			cur.URLs["logs"] = logs
		}
		return ev, cur, nil
	}
	for attempt := 0; ; attempt++ {
		err := state.Release(ctx, cfg.Client, cfg.Keys, cfg.Node, b.Session, w.item.CreateRevision, final)
		if err == nil {
			w.a.markReleased(w.id, w.item.CreateRevision)
			return true
		}
		if errors.Is(err, state.ErrStale) {
			w.log.Debug("binding gone or replaced; nothing to release", "err", err)
			w.a.markReleased(w.id, w.item.CreateRevision)
			return true
		}
		if ctx.Err() != nil {
			if errors.Is(context.Cause(ctx), errUnbound) {
				// The binding is gone: this release committed and the
				// watch saw its delete before the reply came, or the
				// placer took the binding. Either way nothing is left to
				// release, and the container goes.
				w.log.Debug("binding gone while releasing", "err", err)
				return true
			}
			w.log.Warn("release interrupted; the next lease retries it", "err", err)
			return false
		}
		w.log.Warn("release session; retrying", "err", err)
		ctxwait.Sleep(ctx, min(time.Duration(attempt+1)*200*time.Millisecond, 2*time.Second))
	}
}

// currentPart reads the part this worker reports, or, when it reported
// nothing yet (or the part is another binding's), the part of its binding
// before any report.
func (w *worker) currentPart(ctx context.Context) (state.PartStatus, int64, error) {
	cfg := w.a.cfg
	b := w.item.Value
	p, rev, err := state.Get[state.PartStatus](ctx, cfg.Client, cfg.Keys.Part(cfg.Node, b.Session))
	switch {
	case errors.Is(err, state.ErrNotFound):
		return state.NewPartStatus(b, w.item.CreateRevision), 0, nil
	case err != nil:
		return state.PartStatus{}, 0, err
	case p.BindingRevision != w.item.CreateRevision:
		return state.NewPartStatus(b, w.item.CreateRevision), rev, nil
	}
	return p, rev, nil
}

// partOf is the part this worker reports as kv holds it (read with the
// spec, readSpec), or, when kv is nil or another binding's, the part of
// its binding before any report.
func (w *worker) partOf(kv *mvccpb.KeyValue) (state.PartStatus, error) {
	b := w.item.Value
	if kv == nil {
		return state.NewPartStatus(b, w.item.CreateRevision), nil
	}
	p, err := state.Decode[state.PartStatus](kv.Value)
	if err != nil {
		return state.PartStatus{}, fmt.Errorf("read part of %s: %w", b.Session, err)
	}
	if p.BindingRevision != w.item.CreateRevision {
		return state.NewPartStatus(b, w.item.CreateRevision), nil
	}
	return p, nil
}

// knownPart is a worker's part as it last wrote or read it, and its mod
// revision; safe for concurrent use (the worker's loop and its start's
// progress reports both write the part).
type knownPart struct {
	mu  sync.Mutex
	p   state.PartStatus
	rev int64
	ok  bool
}

func (k *knownPart) get() (state.PartStatus, int64, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.p
	if p.URLs != nil { // mutated by setPart's callers: a copy of its own
		p.URLs = maps.Clone(p.URLs)
	}
	return p, k.rev, k.ok
}

func (k *knownPart) set(p state.PartStatus, rev int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.p, k.rev, k.ok = p, rev, true
}

func (k *knownPart) forget() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.ok = false
}

// maxStatusAttempts bounds setPart's read-modify-write retries when
// another writer of the same part (the activity sampler, a transition)
// got in between.
const maxStatusAttempts = 5

// setPart applies event ev and then mutate to this binding's part
// (parts/<node>/<id>), if the binding still exists (a binding deleted and
// bound again elsewhere is another worker's) and the state machine allows
// ev from the part's phase: the transaction compares the binding's create
// revision and the part's mod revision, so a part that moved on (to
// Stopping, say) is never written back. The placers' status merger folds
// the part into the session's status. Failures are logged: a part is
// advisory, the next transition or the final release writes it again. It
// reports whether it wrote.
func (w *worker) setPart(ctx context.Context, ev state.Event, mutate func(*state.PartStatus)) bool {
	cfg := w.a.cfg
	b := w.item.Value
	pk, bk := cfg.Keys.Part(cfg.Node, b.Session), cfg.Keys.Binding(cfg.Node, b.Session)
	for attempt := 0; attempt < maxStatusAttempts; attempt++ {
		p, rev, ok := w.known.get()
		if !ok {
			var err error
			if p, rev, err = w.currentPart(ctx); err != nil {
				if ctx.Err() == nil {
					w.log.Warn("read part", "err", err)
				}
				return false
			}
			w.known.set(p, rev)
		}
		next, err := state.Next(p.Phase, ev, state.Facts{Bound: true})
		if err != nil {
			w.log.Debug("part not written", "err", err)
			return false
		}
		before, _ := state.Encode(p)
		mutate(&p)
		p.Phase = next
		if after, _ := state.Encode(p); after == before {
			return false
		}
		p.Updated = time.Now().UTC()
		ops, err := state.PartOps(cfg.Keys, p)
		if err != nil {
			w.log.Warn("write part", "err", err)
			return false
		}
		resp, err := cfg.Client.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(bk), "=", w.item.CreateRevision),
				clientv3.Compare(clientv3.ModRevision(pk), "=", rev)).
			Then(ops...).
			Else(clientv3.OpGet(bk), clientv3.OpGet(pk)).Commit()
		if err != nil {
			w.known.forget() // it may have committed
			if ctx.Err() == nil {
				w.log.Warn("write part", "err", err)
			}
			return false
		}
		if resp.Succeeded {
			w.known.set(p, resp.Header.Revision)
			return true
		}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 0 || kvs[0].CreateRevision != w.item.CreateRevision {
			w.known.forget()
			return false // the binding is gone or replaced: not ours to write
		}
		// The part moved since this worker knew it: the failed
		// transaction read it.
		w.known.forget()
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
			if cur, err := state.Decode[state.PartStatus](kvs[0].Value); err == nil {
				if cur.BindingRevision != w.item.CreateRevision {
					cur = state.NewPartStatus(b, w.item.CreateRevision)
				}
				w.known.set(cur, kvs[0].ModRevision)
			}
		}
	}
	return false
}

// DefaultStopReportAfter is Config.StopReportAfter's default.
const DefaultStopReportAfter = time.Second

// DefaultRunReportAfter is Config.RunReportAfter's default.
const DefaultRunReportAfter = time.Second
