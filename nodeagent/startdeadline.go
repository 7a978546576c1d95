package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// The stages a part passes through before it runs, as a start that missed
// its deadline names them (StartFailed): the image's pull, the
// container's creation (with, for a multi-node job or a Ray worker, the
// wait for its peers), and readiness (a notebook's Jupyter answering).
const (
	StagePull      = "pull"
	StageCreate    = "create"
	StageReadiness = "readiness"
)

// ReasonStartFailed is the reason of a part (and so of its session) that
// could not start, or was not running within the start deadline.
const ReasonStartFailed = "StartFailed"

// errStartDeadline is the cause of a worker's start context ending at the
// start deadline.
var errStartDeadline = errors.New("start deadline passed")

// pullReportEvery is how often a pull under way reports its progress in
// the part's message; pullReportAfter is when it first reports: an image
// already present (or imported, as voyager.local's) is ready sooner and
// reports nothing, which spares a part write and a status write a start.
const (
	pullReportEvery = 5 * time.Second
	pullReportAfter = 250 * time.Millisecond
)

// startCtx returns the context a worker's start (pull, create, readiness)
// runs under: ctx, ended with cause errStartDeadline at the binding's
// start deadline (its Bound time plus Config.StartTimeout; a binding with
// no Bound time counts from now). There is none without a StartTimeout,
// nor for a container adopted whose part already ran (it started under an
// earlier worker).
func (w *worker) startCtx(ctx context.Context, adopted bool) (context.Context, context.CancelFunc) {
	limit := w.a.cfg.StartTimeout
	if limit <= 0 {
		return ctx, func() {}
	}
	if adopted {
		if p, _, err := w.currentPart(ctx); err != nil || p.Started != nil || p.Phase == state.PhaseRunning {
			return ctx, func() {}
		}
	}
	from := w.item.Value.Bound
	if from.IsZero() {
		from = time.Now()
	}
	w.deadline = from.Add(limit)
	return context.WithDeadlineCause(ctx, w.deadline, errStartDeadline)
}

// startExpired reports whether sctx (from startCtx) ended at the start
// deadline rather than with the worker.
func startExpired(sctx context.Context) bool {
	return errors.Is(context.Cause(sctx), errStartDeadline)
}

// setStage records the stage the start is in, and what it does there.
func (w *worker) setStage(stage, detail string) {
	w.stageMu.Lock()
	w.stage, w.stageDetail = stage, detail
	w.stageMu.Unlock()
}

// reportStage writes the stage the start is in (setStage's detail) into
// the part, with reason, so the session's status says what it waits for.
func (w *worker) reportStage(ctx context.Context, reason string) {
	w.stageMu.Lock()
	detail := w.stageDetail
	w.stageMu.Unlock()
	w.setPart(ctx, state.EventCreate, func(st *state.PartStatus) {
		st.Reason, st.Message = reason, detail
	})
}

// startFailure says why a start missed its deadline: the stage it was in
// and what it did there.
func (w *worker) startFailure() string {
	w.stageMu.Lock()
	stage, detail := w.stage, w.stageDetail
	w.stageMu.Unlock()
	if stage == "" {
		stage, detail = StageCreate, "preparing the container"
	}
	return fmt.Sprintf("not running %s after it was bound (VOYAGER_START_TIMEOUT): stuck at %s: %s",
		w.a.cfg.StartTimeout, stage, detail)
}

// startTimedOut ends a part whose start missed its deadline: its
// container (if any) is stopped, and its end is released as a failed
// start (Failed, or BackOff when the restart policy allows), reason
// StartFailed, saying which stage it was stuck at.
func (w *worker) startTimedOut(ctx context.Context, sess state.Session, stopReq chan struct{}) {
	msg := w.startFailure()
	w.a.startFailures.Add(1)
	w.log.Warn("session not running by its start deadline", "deadline", w.deadline, "why", msg)
	if err := w.a.cfg.Runtime.Stop(ctx, w.id, w.a.cfg.StopGrace); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		w.log.Warn("stop container", "err", err)
		if ctx.Err() != nil {
			return
		}
	}
	if !w.finish(ctx, nil, w.failed(sess, stopReq, ReasonStartFailed, msg)) {
		return
	}
	w.a.removeContainer(context.WithoutCancel(ctx), w.id)
}

// pull makes image present (Runtime.EnsureImage), reporting in the part
// meanwhile, from pullReportAfter on and then every pullReportEvery, that
// it pulls and, where the runtime can tell (runtime.PullProgress), how far
// it has come.
func (w *worker) pull(ctx context.Context, image string) error {
	started := time.Now()
	report := func(first bool) {
		reason, msg := preparingImage(image) // a local image is never pulled
		if pp, ok := w.a.cfg.Runtime.(runtime.PullProgress); ok && !first {
			if done, total, err := pp.Pulled(ctx); err == nil && done > 0 {
				msg += fmt.Sprintf(": %d MiB", done>>20)
				if total > 0 {
					msg += fmt.Sprintf(" of %d MiB", total>>20)
				}
			}
		}
		if !first {
			msg += fmt.Sprintf(" (%s so far)", time.Since(started).Round(time.Second))
		}
		w.setStage(StagePull, msg)
		w.setPart(ctx, state.EventCreate, func(st *state.PartStatus) {
			st.Reason, st.Message = reason, msg
		})
	}
	w.setStage(StagePull, "pulling image "+image)
	done := make(chan struct{})
	reported := make(chan struct{})
	go func() {
		defer close(reported)
		t := time.NewTimer(pullReportAfter)
		defer t.Stop()
		for first := true; ; first = false {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				report(first)
				t.Reset(pullReportEvery)
			}
		}
	}()
	err := w.a.cfg.Runtime.EnsureImage(ctx, image)
	close(done)
	<-reported
	if err != nil {
		return fmt.Errorf("pull image %s: %w", image, err)
	}
	w.setStage(StageCreate, "creating the container")
	return nil
}
