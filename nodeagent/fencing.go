package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/voyager-gpu/voyager/fence"
	"github.com/voyager-gpu/voyager/internal/ctxwait"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// heartbeat is what the agent last told its fence keeper (Config.FenceDir).
type heartbeat struct {
	mu         sync.Mutex
	renewed    time.Time // the last good renewal's send
	containers []string  // sorted
}

// seedBeat takes the containers of the heartbeat an earlier agent of this
// node left, if any: until this agent's first reconcile lists the node's
// containers, its heartbeats still name them, so that the keeper fences
// them should this agent die before then.
func (a *Agent) seedBeat() {
	if a.cfg.FenceDir == "" {
		return
	}
	hb, err := fence.ReadHeartbeat(a.cfg.FenceDir)
	if err != nil {
		return // none, or unreadable: the first reconcile writes the list
	}
	a.hb.mu.Lock()
	defer a.hb.mu.Unlock()
	if a.hb.containers == nil {
		a.hb.containers = slices.Clone(hb.Containers)
	}
}

// beat records a successful renewal sent at sent and writes the heartbeat:
// the keeper fences the node once sent + FenceAfter has passed without
// another.
func (a *Agent) beat(sent time.Time) {
	a.hb.mu.Lock()
	defer a.hb.mu.Unlock()
	if sent.Before(a.hb.renewed) {
		return // a slower answer to an older renewal
	}
	a.hb.renewed = sent
	a.writeBeat()
}

// beatContainers writes the heartbeat again when the node's containers
// (those listed, and those of the bindings, which may start before the
// next renewal) changed since the last one. It is called before any new
// worker starts, so the keeper knows a container before it exists.
func (a *Agent) beatContainers(want map[string]watcher.Item[state.Binding], infos []runtime.Info) {
	if a.cfg.FenceDir == "" {
		return
	}
	ids := make([]string, 0, len(want)+len(infos))
	for id := range want {
		ids = append(ids, id)
	}
	for _, in := range infos {
		ids = append(ids, in.ID)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	a.hb.mu.Lock()
	defer a.hb.mu.Unlock()
	if slices.Equal(ids, a.hb.containers) {
		return
	}
	a.hb.containers = ids
	if !a.hb.renewed.IsZero() {
		a.writeBeat()
	}
}

// writeBeat writes the heartbeat; a.hb.mu is held. A heartbeat that cannot
// be written is logged: the keeper then fences at the last one's deadline,
// which errs on the side of stopping.
func (a *Agent) writeBeat() {
	if a.cfg.FenceDir == "" {
		return
	}
	renewed := fence.At(a.hb.renewed)
	err := fence.WriteHeartbeat(a.cfg.FenceDir, fence.Heartbeat{
		Node: a.cfg.Node, PID: os.Getpid(), Renewed: renewed, Deadline: renewed + int64(a.cfg.FenceAfter),
		Grace: a.cfg.FenceGrace, Containers: slices.Clone(a.hb.containers),
	})
	if err != nil {
		a.log.Error("write the fence heartbeat; the fence keeper will stop the node's containers at the last one's deadline", "err", err)
	}
}

// park writes the heartbeat of a clean shutdown where the lease cannot
// expire meanwhile (Config.ParkOnShutdown): the keeper fences nothing
// until the next agent's first heartbeat.
func (a *Agent) park() {
	if a.cfg.FenceDir == "" {
		return
	}
	a.hb.mu.Lock()
	defer a.hb.mu.Unlock()
	err := fence.WriteHeartbeat(a.cfg.FenceDir, fence.Heartbeat{
		Node: a.cfg.Node, PID: os.Getpid(), Renewed: fence.At(a.hb.renewed), Deadline: math.MaxInt64,
		Grace: a.cfg.FenceGrace, Containers: slices.Clone(a.hb.containers), Parked: true,
	})
	if err != nil {
		a.log.Error("park the fence heartbeat; the fence keeper will stop the node's containers at the last one's deadline", "err", err)
	}
}

// noteFenced records that the agent's own fence stops container id, and
// why: in memory, and in FenceDir's records when set, before the first
// signal.
func (a *Agent) noteFenced(id, cause string) {
	a.mu.Lock()
	a.fenceNotes[id] = cause
	a.mu.Unlock()
	if a.cfg.FenceDir != "" {
		if err := fence.WriteRecord(a.cfg.FenceDir, fence.Record{Container: id, At: time.Now().UTC(), By: "agent", Cause: cause}); err != nil {
			a.log.Warn("write fence record", "container", id, "err", err)
		}
	}
}

// forgetFenced drops what is known of container id's fence: it was
// removed.
func (a *Agent) forgetFenced(id string) {
	a.mu.Lock()
	delete(a.fenceNotes, id)
	a.mu.Unlock()
	if err := fence.RemoveRecord(a.cfg.FenceDir, id); err != nil {
		a.log.Warn("remove fence record", "container", id, "err", err)
	}
}

// fencedWhy reports whether container id was fenced (by this agent, an
// earlier one, or the node's fence keeper), and why.
func (a *Agent) fencedWhy(id string) (string, bool) {
	a.mu.Lock()
	why, ok := a.fenceNotes[id]
	a.mu.Unlock()
	if ok {
		return why, true
	}
	r, ok, err := fence.ReadRecord(a.cfg.FenceDir, id)
	if err != nil {
		a.log.Warn("read fence record", "container", id, "err", err)
	}
	if !ok {
		return "", false
	}
	return fmt.Sprintf("%s at %s", r.Cause, r.At.Format(time.RFC3339)), true
}

// FencedAttempts counts the attempts this agent ended because their
// containers had been fenced (or were gone after their launch).
func (a *Agent) FencedAttempts() int64 { return a.fencedAttempts.Load() }

// fencedEnd ends an attempt whose container was fenced, or is gone after
// its launch was recorded (why says what is known): it is never started
// again in place. The state machine decides what follows: Stopped when its
// owner asked to stop; Pending with reason Fenced, to be re-queued at once
// as the next attempt, when its restart policy has restarts left; else
// Lost, as a node loss ends it. Then the container, if any is left, goes.
func (w *worker) fencedEnd(ctx context.Context, why string) {
	b := w.item.Value
	msg := fmt.Sprintf("attempt %d on %s was fenced and is not started again: %s", b.Attempt, w.a.cfg.Node, why)
	w.a.mu.Lock()
	from, to := w.a.fencedRenewal, w.a.registered
	w.a.mu.Unlock()
	if !from.IsZero() && to.After(from) {
		msg += fmt.Sprintf("; outage: no renewal from %s until the node registered again at %s (%s)",
			from.UTC().Format("15:04:05.000"), to.UTC().Format("15:04:05.000"), to.Sub(from).Round(time.Millisecond))
	}
	w.a.fencedAttempts.Add(1)
	w.log.Warn("attempt fenced; ending it", "why", why)
	decide := func(spec state.Session, cur *state.PartStatus) (outcome, error) {
		switch {
		case spec.Desired == state.DesiredStopped:
			return outcome{phase: state.PhaseStopped, reason: "StopRequested", msg: "stopped on request; " + msg}, nil
		case spec.RestartsLeft(cur.Attempt) && spec.Eviction == nil:
			now := time.Now().UTC()
			return outcome{phase: state.PhasePending, reason: state.ReasonFenced, msg: msg, retryAt: &now}, nil
		}
		return outcome{phase: state.PhaseLost, reason: state.ReasonFenced, msg: msg + "; no restart left"}, nil
	}
	if !w.finish(ctx, nil, decide) {
		return
	}
	w.a.removeContainer(context.WithoutCancel(ctx), w.id)
}

// createContext is the context of the create that follows a recorded
// launch, from the worker's ctx. A graceful stop of the agent does not
// abandon the create: a launch recorded with no container behind it ends
// its attempt as fenced once the next agent finds it (it cannot tell a
// create that never ran from a container removed behind its back), so the
// create goes on, Run waits for it, and the next agent adopts the
// container as it adopts every container a stopped agent left. Anything
// else that ends ctx (a fence, a lost lease, the binding's removal) still
// ends the create, and so does the fence deadline of the latest renewal
// (FenceAfter after it): from then on the node's fence keeper stops what
// the node runs. That deadline moves on with every renewal, for a create
// may rightly take longer than FenceAfter: a part of a multi-node job
// waits in it for its peers' addresses (MeshWait).
func (a *Agent) createContext(ctx context.Context) (context.Context, context.CancelFunc) {
	c, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		if !a.stopping() {
			cancel(context.Cause(ctx))
		}
	})
	// Each firing re-arms at the latest renewal's deadline; once c has
	// ended, the chain stops at its next firing.
	var arm func()
	arm = func() {
		if c.Err() != nil {
			return
		}
		wait := time.Until(time.Unix(0, a.renewed.Load()).Add(a.cfg.FenceAfter))
		if wait <= 0 {
			cancel(errFenceDeadline)
			return
		}
		time.AfterFunc(wait, arm)
	}
	arm()
	return c, func() { stop(); cancel(context.Canceled) }
}

// errFenceDeadline ends a create (createContext) that is still under way
// at the fence deadline of the agent's latest renewal.
var errFenceDeadline = errors.New("fence deadline of the latest renewal passed")

// stopping reports whether Run's context has ended: the agent is stopping
// gracefully.
func (a *Agent) stopping() bool {
	p := a.runCtx.Load()
	return p != nil && (*p).Err() != nil
}

// errLaunchUnknown means the launch could not be recorded (etcd did not
// answer): nothing was started, and a later worker decides again.
var errLaunchUnknown = errors.New("launch not recorded")

// launch records the attempt's launch (state.Launch), retrying a few times
// when etcd does not answer; a retry of a commit whose answer was lost
// finds its own launch (the same time) and goes on.
func (w *worker) launch(ctx context.Context, again bool) error {
	at := time.Now()
	var err error
	for attempt := 1; attempt <= 5; attempt++ {
		var p state.PartStatus
		var rev int64
		// The first try decides from what was read with the spec.
		read := w.launchRead
		w.launchRead = nil
		p, rev, err = state.LaunchFrom(ctx, w.a.cfg.Client, w.a.cfg.Keys, w.item.Value, w.item.CreateRevision, again, at, read)
		if err == nil {
			w.known.set(p, rev)
		}
		if err == nil || errors.Is(err, state.ErrLaunched) || errors.Is(err, state.ErrStale) || errors.Is(err, state.ErrEnded) || ctx.Err() != nil {
			return err
		}
		w.log.Warn("record the launch; retrying", "err", err)
		if !ctxwait.Sleep(ctx, time.Duration(attempt)*200*time.Millisecond) {
			return err
		}
	}
	return fmt.Errorf("%w: %w", errLaunchUnknown, err)
}

// fencedWhy says why the worker's launched container is gone or ended:
// its fence record's cause, else that it was removed while no agent
// watched it.
func (w *worker) fencedWhy() string {
	if why, ok := w.a.fencedWhy(w.id); ok {
		return why
	}
	return "its container is gone after its launch was recorded (removed while its agent was away)"
}
