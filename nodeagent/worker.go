package nodeagent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/ctxwait"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// worker drives one binding's container from start to release. Its context
// derives from the lease: cancelled with errUnbound it removes the
// container; cancelled for any other cause it leaves the container running
// for the next lease's worker to adopt.
type worker struct {
	a      *Agent
	id     string // container id
	item   watcher.Item[state.Binding]
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{}
	log    *slog.Logger

	// token is the Jupyter token of a notebook's head (or single) part,
	// set before the container starts or is adopted.
	token string
	// logsExp is when the log URL last written to the status (or, for a
	// worker part of a multi-node job, to its secrets) expires (zero: none
	// written by this worker).
	logsExp time.Time
	// jobWorker is set for a worker part (rank 1 or more) of a multi-node
	// job: its part keeps its log URL fresh (its key in the node's
	// secrets), where the API finds each part's log, as a head's is.
	jobWorker bool

	// stopReq closes when the session is to stop; a multi-node job's part
	// waiting for its peers' addresses gives up then.
	stopReq <-chan struct{}
	// stopWith is the session as it was when stopReq closed: whether its
	// owner stopped it or the lifecycle controller evicted it decides the
	// final status. Written before the close, read after it.
	stopWith state.Session

	// deadline is the start deadline (startdeadline.go; zero: none);
	// stage and stageDetail say where the start is, for the reason of a
	// start that misses it.
	deadline           time.Time
	stageMu            sync.Mutex
	stage, stageDetail string
	// secretsErr is why the session's secrets could not be joined into
	// its spec (errNoSecrets): it does not start without them.
	secretsErr error
}

func (a *Agent) newWorker(parent context.Context, id string, it watcher.Item[state.Binding]) *worker {
	ctx, cancel := context.WithCancelCause(parent)
	return &worker{
		a: a, id: id, item: it, ctx: ctx, cancel: cancel, done: make(chan struct{}),
		log: a.log.With("session", it.Value.Session, "container", id, "role", it.Value.Role),
	}
}

type exitResult struct {
	code int
	err  error
}

func (w *worker) run() {
	defer close(w.done)
	defer w.cancel(nil)
	ctx := w.ctx
	b := w.item.Value
	cfg := w.a.cfg
	rt := cfg.Runtime

	sess, rev, err := state.Get[state.Session](ctx, cfg.Client, cfg.Keys.Session(b.Session))
	gone := errors.Is(err, state.ErrNotFound)
	if err != nil && !gone {
		w.retryLater("read session", err)
		return
	}
	if gone {
		sess = state.Session{ID: b.Session, Desired: state.DesiredStopped}
	}
	if sess, err = w.a.withSecrets(ctx, sess); err != nil && !errors.Is(err, errNoSecrets) {
		w.retryLater("read session secrets", err)
		return
	}
	w.secretsErr = err
	w.jobWorker = sess.Gang() && b.Role == state.RoleWorker
	stopReq := make(chan struct{})
	stop := &stopSignal{w: w, ch: stopReq}
	w.stopReq = stopReq
	if sess.Stopping() {
		stop.fire(sess)
	} else {
		go w.watchSession(ctx, rev, stop)
		if b.Role == state.RoleWorker || b.Role == state.RoleHead {
			go w.watchHeadEnd(ctx, stop)
		}
	}

	info, err := rt.Status(ctx, w.id)
	again := false // the attempt's launch is recorded, but nothing of it ran
	if err == nil && info.State == runtime.StateCreated {
		// Created but never started: an agent died inside Start. Nothing
		// ran, so start it afresh rather than wait on a process that never
		// will.
		w.log.Info("removing a container that was created but never started")
		if err := rt.Remove(ctx, w.id); err != nil {
			w.retryLater("remove half-made container", err)
			return
		}
		info, err = rt.Status(ctx, w.id)
		again = true
	}
	adopted := err == nil
	sctx, scancel := w.startCtx(ctx, adopted) // start under the start deadline
	defer scancel()
	switch {
	case errors.Is(err, runtime.ErrNotFound):
		select {
		case <-stopReq:
			w.stop(ctx) // nothing runs: release only
			return
		default:
		}
		if !again {
			// Launched and gone: fenced, or removed while no agent
			// watched. The attempt may have run: it never starts again.
			p, _, err := w.currentPart(ctx)
			if err != nil {
				w.retryLater("read part", err)
				return
			}
			if p.Launched != nil {
				w.fencedEnd(ctx, w.fencedWhy())
				return
			}
		}
		err := w.start(sctx, sess, again)
		if err != nil {
			if ctx.Err() != nil {
				w.ended()
				return
			}
			if errors.Is(err, state.ErrLaunched) {
				w.fencedEnd(ctx, w.fencedWhy())
				return
			}
			if errors.Is(err, state.ErrStale) || errors.Is(err, errLaunchUnknown) {
				w.retryLater("record the launch", err) // the binding went (reconcile cancels this worker), or etcd did not answer
				return
			}
			if startExpired(sctx) {
				w.startTimedOut(ctx, sess, stopReq)
				return
			}
			w.a.startFailures.Add(1)
			w.log.Warn("session failed to start", "err", err)
			w.finish(ctx, nil, w.failed(sess, stopReq, ReasonStartFailed, err.Error()))
			w.a.removeContainer(context.WithoutCancel(ctx), w.id)
			return
		}
		info = runtime.Info{ID: w.id, State: runtime.StateRunning}
	case err != nil:
		w.retryLater("read container", err)
		return
	default:
		if w.token, err = w.jupyterToken(sess); err != nil {
			w.retryLater("make token", err)
			return
		}
		w.a.adopted.Add(1)
		w.log.Info("adopted running container", "state", info.State)
	}

	exitCh := make(chan exitResult, 1)
	go func() {
		code, err := rt.Wait(ctx, w.id)
		exitCh <- exitResult{code, err}
	}()

	if info.State != runtime.StateStopped {
		if r, stop, ok := w.awaitReady(sctx, sess, info, adopted, exitCh, stopReq); !ok {
			switch {
			case r != nil:
				w.exited(ctx, sess, *r, stopReq)
			case stop:
				w.stop(ctx)
			case ctx.Err() == nil && startExpired(sctx):
				w.startTimedOut(ctx, sess, stopReq)
			default:
				w.ended()
			}
			return
		}
	}

	trim := time.NewTicker(10 * time.Second)
	defer trim.Stop()
	// The head (or single) part samples the session's activity; a
	// worker's part reports only its phases and its end.
	var sampleC <-chan time.Time
	var act *activity
	if b.Role != state.RoleWorker {
		act = w.newActivity(sess, info)
		defer w.a.forgetActivity(b.Session)
		sample := time.NewTicker(cfg.ActivityEvery)
		defer sample.Stop()
		sampleC = sample.C
	}
	for {
		select {
		case r := <-exitCh:
			if r.err != nil {
				if ctx.Err() != nil {
					w.ended()
					return
				}
				w.retryLater("wait for container", r.err)
				return
			}
			w.exited(ctx, sess, r, stopReq)
			return
		case <-stopReq:
			w.stop(ctx)
			return
		case <-ctx.Done():
			w.ended()
			return
		case <-sampleC:
			act.sample(ctx)
		case <-trim.C:
			if cfg.LogDir != "" {
				if _, err := runtime.TrimLog(w.logPath(), cfg.LogMaxBytes); err != nil {
					w.log.Warn("trim log", "err", err)
				}
			}
			w.refreshLogsURL(ctx)
		}
	}
}

func (w *worker) logPath() string {
	if w.a.cfg.LogDir == "" {
		return ""
	}
	return filepath.Join(w.a.cfg.LogDir, w.id+".log")
}

// retryLater logs a failure to read and waits a little before the worker
// returns, so that the next reconcile's new worker does not spin while etcd
// or containerd is down.
func (w *worker) retryLater(what string, err error) {
	if w.ctx.Err() == nil {
		w.log.Warn(what+"; retrying", "err", err)
		ctxwait.Sleep(w.ctx, time.Second)
	}
	if errors.Is(context.Cause(w.ctx), errUnbound) {
		w.a.removeContainer(context.WithoutCancel(w.ctx), w.id)
	}
}

// ended handles the end of the worker's context: a binding that is gone
// takes its container with it; a lost lease or a shutdown leaves it.
func (w *worker) ended() {
	if errors.Is(context.Cause(w.ctx), errUnbound) {
		w.log.Info("binding removed; stopping container")
		w.a.removeContainer(context.WithoutCancel(w.ctx), w.id)
	}
}

// stopSignal closes a worker's stopReq once, recording in w.stopWith the
// session as it was: the spec's watch and, for a Ray worker, the head's end
// may both fire.
type stopSignal struct {
	once sync.Once
	w    *worker
	ch   chan struct{}
}

func (s *stopSignal) fire(with state.Session) {
	s.once.Do(func() {
		s.w.stopWith = with
		close(s.ch)
	})
}

// watchSession fires stop when the session is to stop (its owner stopped
// it, or it was evicted: Session.Stopping) or is deleted.
func (w *worker) watchSession(ctx context.Context, rev int64, stop *stopSignal) {
	key := w.a.cfg.Keys.Session(w.item.Value.Session)
	deleted := state.Session{ID: w.item.Value.Session, Desired: state.DesiredStopped}
	for ctx.Err() == nil {
		wch := w.a.cfg.Client.Watch(clientv3.WithRequireLeader(ctx), key, clientv3.WithRev(rev+1))
		for resp := range wch {
			if resp.Err() != nil {
				break
			}
			for _, ev := range resp.Events {
				rev = ev.Kv.ModRevision
				if ev.Type == clientv3.EventTypeDelete {
					stop.fire(deleted)
					return
				}
				if s, err := state.Decode[state.Session](ev.Kv.Value); err == nil && s.Stopping() {
					stop.fire(s)
					return
				}
			}
		}
		// The watch broke (no leader, compaction): read again and resume.
		s, r, err := state.Get[state.Session](ctx, w.a.cfg.Client, key)
		switch {
		case errors.Is(err, state.ErrNotFound):
			stop.fire(deleted)
			return
		case err == nil && s.Stopping():
			stop.fire(s)
			return
		case err == nil:
			rev = r
		default:
			ctxwait.Sleep(ctx, time.Second)
		}
	}
}

// watchHeadEnd fires stop when the session's status shows that the
// session ended for this binding: it is terminal, waits to run again
// (Pending: released), names another queueing, or is gone. The parts of a
// gang end with their session: a Ray worker's when its head ended, a
// multi-node job's when the status merger ended the job (rank 0 ended, or
// a part failed under StopAll: state.MergeParts); nothing else would stop
// them, and they would hold their GPUs until retention.
func (w *worker) watchHeadEnd(ctx context.Context, stop *stopSignal) {
	key := w.a.cfg.Keys.Status(w.item.Value.Session)
	qrev := w.item.Value.QueueRevision
	ended := state.Session{ID: w.item.Value.Session, Desired: state.DesiredStopped}
	over := func(st state.Status) bool {
		return st.Phase.Terminal() || st.Phase == state.PhasePending ||
			(st.QueueRevision != 0 && qrev != 0 && st.QueueRevision != qrev)
	}
	for ctx.Err() == nil {
		st, rev, err := state.Get[state.Status](ctx, w.a.cfg.Client, key)
		switch {
		case errors.Is(err, state.ErrNotFound), err == nil && over(st):
			stop.fire(ended)
			return
		case err != nil:
			ctxwait.Sleep(ctx, time.Second)
			continue
		}
		for resp := range w.a.cfg.Client.Watch(clientv3.WithRequireLeader(ctx), key, clientv3.WithRev(rev+1)) {
			if resp.Err() != nil {
				break
			}
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete {
					stop.fire(ended)
					return
				}
				if st, err := state.Decode[state.Status](ev.Kv.Value); err == nil && over(st) {
					stop.fire(ended)
					return
				}
			}
		}
	}
}

// jupyterToken is the token of the session's Jupyter when this part runs
// it (a notebook's head or single part), else "": the session's own
// (JupyterHub's spawner sets it) or one derived from the container id.
func (w *worker) jupyterToken(sess state.Session) (string, error) {
	if sess.Kind != state.KindNotebook || w.item.Value.Role == state.RoleWorker {
		return "", nil
	}
	if t := sess.Env["JUPYTER_TOKEN"]; t != "" {
		return t, nil
	}
	return w.a.jupyterToken(w.id)
}

// peers reads where the session's other parts run (Ray gangs), for the
// part's network rules.
func (w *worker) peers(ctx context.Context, sess state.Session) ([]Peer, error) {
	cfg := w.a.cfg
	b := w.item.Value
	if b.Role == state.RoleSingle || b.Role == "" {
		return nil, nil
	}
	st, _, err := state.Get[state.Status](ctx, cfg.Client, cfg.Keys.Status(b.Session))
	if err != nil {
		return nil, fmt.Errorf("find the other parts of %s: %w", b.Session, err)
	}
	var out []Peer
	for _, n := range st.Nodes {
		if n == cfg.Node {
			continue
		}
		pb, _, err := state.Get[state.Binding](ctx, cfg.Client, cfg.Keys.Binding(n, b.Session))
		if errors.Is(err, state.ErrNotFound) {
			continue // released already
		}
		if err != nil {
			return nil, fmt.Errorf("find the other parts of %s: %w", b.Session, err)
		}
		pn, _, err := state.Get[state.Node](ctx, cfg.Client, cfg.Keys.Node(n))
		if err != nil {
			return nil, fmt.Errorf("find the other parts of %s: node %s: %w", b.Session, n, err)
		}
		p, err := SplitPorts(sess.Kind, pb.Role, pb.Ports)
		if err != nil {
			return nil, fmt.Errorf("find the other parts of %s: %w", b.Session, err)
		}
		out = append(out, Peer{Address: pn.Address, Ports: p})
	}
	return out, nil
}

// start pulls the image, records the attempt's launch (state.Launch: at
// most once per binding, unless again says nothing of it ran) and creates
// the container; w.token is set.
func (w *worker) start(ctx context.Context, sess state.Session, again bool) error {
	if w.secretsErr != nil {
		return w.secretsErr
	}
	cfg := w.a.cfg
	b := w.item.Value
	image := sess.Image
	if image == "" {
		image = cfg.Image
	}
	if err := w.pull(ctx, image); err != nil { // reports its progress
		return err
	}
	var head Head
	if b.Role == state.RoleWorker {
		var err error
		if head, err = w.findHead(ctx, sess); err != nil {
			return err
		}
	}
	args, err := Command(sess, b, head)
	if err != nil {
		return err
	}
	if w.token, err = w.jupyterToken(sess); err != nil {
		return err
	}
	spec, err := w.a.ContainerSpec(sess, b, args, w.token)
	if err != nil {
		return err
	}
	tok, err := w.a.rayToken(ctx, sess)
	if err != nil {
		return err
	}
	if tok != "" {
		spec.Env["RAY_AUTH_MODE"], spec.Env["RAY_AUTH_TOKEN"] = "token", tok
	}
	var peers []Peer
	if sess.Gang() {
		peers, err = w.withJob(ctx, sess, &spec)
	} else {
		peers, err = w.peers(ctx, sess)
	}
	if err != nil {
		return err
	}
	if p, err := PartPorts(sess, b.Role, b.Ports); err == nil {
		spec.Publish, spec.Reach = NetworkRules(p, peers)
	}
	if err := w.launch(ctx, again); err != nil {
		return err
	}
	if err := cfg.Runtime.Start(ctx, spec); err != nil && !errors.Is(err, runtime.ErrExists) {
		return err
	}
	w.a.starts.Add(1)
	w.log.Info("container started", "image", spec.Image)
	w.setPart(ctx, state.EventCreate, func(st *state.PartStatus) {
		st.Reason, st.Message = "Created", "container started"
	})
	return nil
}

// findHead reads where the session's Ray head runs.
func (w *worker) findHead(ctx context.Context, sess state.Session) (Head, error) {
	cfg := w.a.cfg
	b := w.item.Value
	hb, _, err := state.Get[state.Binding](ctx, cfg.Client, cfg.Keys.Binding(b.HeadNode, b.Session))
	if err != nil {
		return Head{}, fmt.Errorf("find Ray head of %s: %w", b.Session, err)
	}
	hn, _, err := state.Get[state.Node](ctx, cfg.Client, cfg.Keys.Node(b.HeadNode))
	if err != nil {
		return Head{}, fmt.Errorf("find Ray head of %s: %w", b.Session, err)
	}
	p, err := SplitPorts(sess.Kind, state.RoleHead, hb.Ports)
	if err != nil {
		return Head{}, fmt.Errorf("find Ray head of %s: %w", b.Session, err)
	}
	return Head{Address: hn.Address, GCSPort: p.RayGCS}, nil
}

// awaitReady waits until the session serves: a notebook once Jupyter's
// port answers HTTP, anything else at once; then it writes Running. It
// returns ok, or why not: the exit of the container, a stop request, or
// the end of ctx.
func (w *worker) awaitReady(ctx context.Context, sess state.Session, info runtime.Info, adopted bool, exitCh chan exitResult, stopReq chan struct{}) (*exitResult, bool, bool) {
	b := w.item.Value
	url, port := "", 0
	if sess.Kind == state.KindNotebook && b.Role != state.RoleWorker {
		p, err := SplitPorts(sess.Kind, b.Role, b.Ports)
		if err == nil && p.Jupyter > 0 {
			probe := "http://" + net.JoinHostPort(w.a.cfg.ProbeHost, strconv.Itoa(p.Jupyter)) + "/"
			w.setStage(StageReadiness, "waiting for Jupyter to answer on port "+strconv.Itoa(p.Jupyter))
			if !adopted {
				w.reportStage(ctx, "WaitingForJupyter")
			}
			client := &http.Client{Timeout: time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
		probing:
			for {
				if resp, err := client.Get(probe); err == nil {
					resp.Body.Close()
					break probing
				}
				select {
				case r := <-exitCh:
					if r.err != nil {
						return nil, false, false
					}
					return &r, false, false
				case <-stopReq:
					return nil, true, false
				case <-ctx.Done():
					return nil, false, false
				case <-tick.C:
				}
			}
			port = p.Jupyter
			// "/" serves both: JupyterLab redirects it to /lab.
			url = fmt.Sprintf("http://%s:%d/", w.a.cfg.Address, p.Jupyter)
			if tok := w.token; tok != "" {
				url += "?token=" + tok
			}
		}
	}
	// Running is written under the worker's context, not the start's
	// (ctx): a start that made it just at its deadline still says so.
	w.setPart(w.ctx, state.EventStart, func(st *state.PartStatus) {
		if adopted && st.Phase == state.PhaseRunning {
			return
		}
		now := time.Now().UTC()
		st.Reason, st.Started = "Started", &now
		st.Message = "running"
		if logs, exp := w.a.logsURL(w.id); logs != "" {
			if st.URLs == nil {
				st.URLs = map[string]string{}
			}
			st.URLs["logs"], w.logsExp = logs, exp
		}
		if url != "" {
			st.Message = "Jupyter answers on port " + strconv.Itoa(port)
			if st.URLs == nil {
				st.URLs = map[string]string{}
			}
			st.URLs["jupyter"] = url
		}
	})
	return nil, false, true
}

// refreshLogsURL re-signs the log URL in the status of a running session
// once half its life has passed (or none was written by this worker: an
// adopted container's), so that it works for as long as the session runs.
func (w *worker) refreshLogsURL(ctx context.Context) {
	if (w.item.Value.Role == state.RoleWorker && !w.jobWorker) || time.Until(w.logsExp) > w.a.cfg.LogURLTTL/2 {
		return
	}
	logs, exp := w.a.logsURL(w.id)
	if logs == "" {
		return
	}
	ok := w.setPart(ctx, state.EventObserve, func(st *state.PartStatus) {
		if st.URLs == nil {
			st.URLs = map[string]string{}
		}
		st.URLs["logs"] = logs
	})
	if ok {
		w.logsExp = exp
	}
}

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
	w.setPart(ctx, state.EventStop, func(st *state.PartStatus) {
		st.Reason, st.Message = reason, msg
	})
	var code *int
	if err := cfg.Runtime.Stop(ctx, w.id, cfg.StopGrace); err == nil {
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
		p, rev, err := w.currentPart(ctx)
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn("read part", "err", err)
			}
			return false
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
			Else(clientv3.OpGet(bk)).Commit()
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn("write part", "err", err)
			}
			return false
		}
		if resp.Succeeded {
			return true
		}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 0 || kvs[0].CreateRevision != w.item.CreateRevision {
			return false // the binding is gone or replaced: not ours to write
		}
	}
	return false
}
