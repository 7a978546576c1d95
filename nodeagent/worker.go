package nodeagent

import (
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

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
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
	// launchRead is what the launch decides from (state.LaunchReads), as
	// read with the spec: the first launch decides from it
	// (state.LaunchFrom) rather than reading again.
	launchRead []*etcdserverpb.ResponseOp

	// started is when this worker started the container (zero for an
	// adopted one); runningDue, when set, writes the part Running: a
	// batch part reports it only once its container has run for
	// Config.RunReportAfter (run's loop), and a container that ended
	// sooner is reported by its end alone, with this start.
	started    time.Time
	runningDue func()

	// known is the part this worker last wrote or read, with its mod
	// revision (outcome.go: setPart writes from it without reading first;
	// its transaction compares that revision, and a part that moved is read
	// again).
	known knownPart
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

	sess, rev, launchRead, secretsErr, err := w.a.readSpec(ctx, b, w.item.CreateRevision)
	gone := errors.Is(err, state.ErrNotFound)
	if err != nil && !gone {
		w.retryLater("read session", err)
		return
	}
	if gone {
		sess, secretsErr = state.Session{ID: b.Session, Desired: state.DesiredStopped}, nil
	}
	w.secretsErr = secretsErr
	w.launchRead = launchRead
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
			// (The part as read with the spec; one launched since is
			// refused by the launch's own transaction, ErrLaunched.)
			var partKV *mvccpb.KeyValue
			if len(launchRead) == 3 {
				if kvs := launchRead[1].GetResponseRange().Kvs; len(kvs) > 0 {
					partKV = kvs[0]
				}
			}
			p, err := w.partOf(partKV)
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
			if errors.Is(err, state.ErrEnded) {
				// The session ended for this binding before its part
				// launched (a multi-node job's rank 0 ended): nothing
				// starts; release only.
				stop.fire(state.Session{ID: b.Session, Desired: state.DesiredStopped})
				w.stop(ctx)
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
	var runningC <-chan time.Time
	if w.runningDue != nil {
		t := time.NewTimer(cfg.RunReportAfter)
		defer t.Stop()
		runningC = t.C
	}
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
		case <-runningC:
			w.runningDue()
			w.runningDue, runningC = nil, nil
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
		if ctx.Err() != nil {
			return
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
	// The bind wrote the status, live for this queueing, in the
	// binding's own revision: the first watch starts right after it,
	// with nothing to read first. A watch that breaks (compacted, no
	// leader) reads the status again and resumes after it.
	rev, read := w.item.CreateRevision, false
	for ctx.Err() == nil {
		if read || rev <= 0 {
			st, r, err := state.Get[state.Status](ctx, w.a.cfg.Client, key)
			switch {
			case errors.Is(err, state.ErrNotFound), err == nil && over(st):
				stop.fire(ended)
				return
			case err != nil:
				ctxwait.Sleep(ctx, time.Second)
				continue
			}
			rev = r
		}
		read = true
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
	st, ok := w.boundStatus()
	if !ok {
		var err error
		if st, _, err = state.Get[state.Status](ctx, cfg.Client, cfg.Keys.Status(b.Session)); err != nil {
			return nil, fmt.Errorf("find the other parts of %s: %w", b.Session, err)
		}
	}
	var others []string
	for _, n := range st.Nodes {
		if n != cfg.Node {
			others = append(others, n)
		}
	}
	if len(others) == 0 {
		return nil, nil
	}
	pbs, pns, err := w.a.bindingsAndNodes(ctx, b.Session, others)
	if err != nil {
		return nil, fmt.Errorf("find the other parts of %s: %w", b.Session, err)
	}
	var out []Peer
	for i, n := range others {
		pb, pn := pbs[i], pns[i]
		if pb == nil {
			continue // released already
		}
		if pn == nil {
			return nil, fmt.Errorf("find the other parts of %s: node %s: %w", b.Session, n, state.ErrNotFound)
		}
		p, err := SplitPorts(sess.Kind, pb.Role, pb.Ports)
		if err != nil {
			return nil, fmt.Errorf("find the other parts of %s: %w", b.Session, err)
		}
		out = append(out, Peer{Address: pn.Address, Ports: p})
	}
	return out, nil
}

// boundStatus is the session's status as read with the spec (launchRead,
// at or after the binding's revision), if it is of this binding's
// queueing: the nodes it names are those the bind wrote with the
// binding, and stay while the binding does.
func (w *worker) boundStatus() (state.Status, bool) {
	if len(w.launchRead) != 3 {
		return state.Status{}, false
	}
	kvs := w.launchRead[2].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return state.Status{}, false
	}
	st, err := state.Decode[state.Status](kvs[0].Value)
	if err != nil || st.QueueRevision != w.item.Value.QueueRevision || w.item.Value.QueueRevision == 0 {
		return state.Status{}, false
	}
	return st, true
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
	if err := w.launch(ctx, again); err != nil { // the part says Starting from here
		return err
	}
	cctx, cancel := w.a.createContext(ctx) // a graceful stop lets it finish
	defer cancel()
	if err := cfg.Runtime.Start(cctx, spec); err != nil && !errors.Is(err, runtime.ErrExists) {
		return err
	}
	w.started = time.Now().UTC()
	w.a.starts.Add(1)
	w.log.Info("container started", "image", spec.Image)
	return nil
}

// findHead reads where the session's Ray head runs.
func (w *worker) findHead(ctx context.Context, sess state.Session) (Head, error) {
	b := w.item.Value
	hbs, hns, err := w.a.bindingsAndNodes(ctx, b.Session, []string{b.HeadNode})
	if err != nil {
		return Head{}, fmt.Errorf("find Ray head of %s: %w", b.Session, err)
	}
	hb, hn := hbs[0], hns[0]
	if hb == nil || hn == nil {
		return Head{}, fmt.Errorf("find Ray head of %s on %s (binding found %t, node found %t): %w", b.Session, b.HeadNode, hb != nil, hn != nil, state.ErrNotFound)
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
	// A batch part's container that this worker started says so only
	// once it has run for RunReportAfter (nobody waits on its
	// readiness): one that ends sooner (a quick job, a command that
	// fails at once) is reported by its end alone.
	report := func() {
		w.reportRunning(adopted, url, port)
	}
	if sess.Kind == state.KindBatch && !adopted && !w.started.IsZero() && w.a.cfg.RunReportAfter > 0 {
		w.runningDue = report
		return nil, false, true
	}
	report()
	return nil, false, true
}

// reportRunning writes the part Running, with its start, its log URL
// and, for a notebook, its Jupyter URL (url, on port).
func (w *worker) reportRunning(adopted bool, url string, port int) {
	w.setPart(w.ctx, state.EventStart, func(st *state.PartStatus) {
		if adopted && st.Phase == state.PhaseRunning {
			return
		}
		now := time.Now().UTC()
		if !w.started.IsZero() {
			now = w.started
		}
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
