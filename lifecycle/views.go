package lifecycle

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// specView is what the controller's rules read of a session's spec
// (sessions/<id>). The controller's caches keep this instead of the
// decoded spec: at 100,000 sessions whole specs (image, command,
// environment, volumes, groups) held hundreds of MiB in every placer
// process (issue 16 (d)). A write that needs the whole spec (an eviction,
// a re-queue) reads it from etcd and acts only if it is still at the
// revision the decision was made on (readWhole).
type specView struct {
	maxRuntime, idleTimeout time.Duration
	notebook                bool // Kind is KindNotebook
	stopped                 bool // Desired is DesiredStopped
	evicted                 bool // Eviction is set
	resizing                bool // Session.Resizing(): evicted to run again at another size
	// elastic is the spec's Elastic (its range, the size its last resize
	// asked for and when); nil for a fixed-size session.
	elastic *state.Elastic
	// owner, team, groups and priority are an elastic job's (Session's):
	// the claim of a resize under way is counted as the job's
	// (resizeClaim). Unset for a fixed-size session.
	owner, team string
	groups      []string
	priority    int
	// part is, for a range of machines (elastic.ByNodes), each machine's
	// request: where one more fits, the job may grow. Nil otherwise.
	part *state.Resources
}

// stopping is state.Session.Stopping.
func (s specView) stopping() bool { return s.stopped || s.evicted }

// viewSpec is the spec's view.
func viewSpec(s state.Session) specView {
	v := specView{
		maxRuntime:  s.Limits.MaxRuntime.Std(),
		idleTimeout: s.Limits.IdleTimeout.Std(),
		notebook:    s.Kind == state.KindNotebook,
		stopped:     s.Desired == state.DesiredStopped,
		evicted:     s.Eviction != nil,
		resizing:    s.Resizing(),
		elastic:     s.Elastic,
	}
	if s.Elastic != nil {
		v.owner, v.team, v.groups, v.priority = s.Owner, s.Team, s.Groups, s.Priority
	}
	if s.Elastic != nil && s.Elastic.ByNodes() {
		r := s.Resources
		v.part = &r
	}
	return v
}

// decodeView decodes a stored W into its view V.
func decodeView[W, V any](view func(W) V) watcher.DecodeFunc[V] {
	return func(key string, value []byte) (V, error) {
		w, err := state.Decode[W](value)
		if err != nil {
			var zero V
			return zero, fmt.Errorf("decode %s: %w", key, err)
		}
		return view(w), nil
	}
}

// decodeSpec decodes a stored spec into its view.
var decodeSpec = decodeView(viewSpec)

// statusView is what the controller's rules read of a session's status
// (status/<id>); kept instead of the whole status for the reason given at
// specView. Times left unset in the status are zero here.
type statusView struct {
	started, retryAt, lastActive time.Time
	bound                        time.Time // when its current parts were bound
	terminal                     bool      // Phase.Terminal()
	running                      bool      // Phase is PhaseRunning
	starting                     bool      // Phase is PhaseBound or PhaseStarting
	waiting                      bool      // Status.Waiting(): waits to be re-queued
	sampled                      bool      // Activity is set
	// goodput is an elastic job's goodput reports (Elastic.Goodput).
	goodput []state.GoodputSample
}

// viewStatus is the status's view.
func viewStatus(st state.Status) statusView {
	v := statusView{
		terminal: st.Phase.Terminal(),
		running:  st.Phase == state.PhaseRunning,
		starting: st.Phase == state.PhaseBound || st.Phase == state.PhaseStarting,
		waiting:  st.Waiting(),
		sampled:  st.Activity != nil,
	}
	if st.Started != nil {
		v.started = *st.Started
	}
	if st.RetryAt != nil {
		v.retryAt = *st.RetryAt
	}
	if st.Bound != nil {
		v.bound = *st.Bound
	}
	if st.Activity != nil {
		v.lastActive = st.Activity.LastActive
	}
	if st.Elastic != nil {
		v.goodput = st.Elastic.Goodput
	}
	return v
}

// decodeStatus decodes a stored status into its view.
var decodeStatus = decodeView(viewStatus)

// whole is a session's spec and status as stored.
type whole struct {
	spec   state.Session
	status state.Status
}

// readWhole reads session id's spec, and its status when statusRev is not
// zero, in one round trip, for a write that rewrites them whole. ok is
// false when either is no longer at the revision given (the one the
// decision was made on): the write would be refused, so it is not tried.
func (c *Controller) readWhole(ctx context.Context, id string, specRev, statusRev int64) (w whole, ok bool, err error) {
	k := c.cfg.Keys
	ops := []clientv3.Op{clientv3.OpGet(k.Session(id))}
	if statusRev != 0 {
		ops = append(ops, clientv3.OpGet(k.Status(id)))
	}
	r, err := c.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return w, false, fmt.Errorf("read spec and status: %w", err)
	}
	kvs := state.FirstKVs(r)
	at := func(i int, rev int64) ([]byte, bool) {
		if kvs[i] == nil || kvs[i].ModRevision != rev {
			return nil, false
		}
		return kvs[i].Value, true
	}
	val, ok := at(0, specRev)
	if !ok {
		return w, false, nil
	}
	if w.spec, err = state.Decode[state.Session](val); err != nil {
		return w, false, fmt.Errorf("read spec: %w", err)
	}
	if statusRev != 0 {
		if val, ok = at(1, statusRev); !ok {
			return w, false, nil
		}
		if w.status, err = state.Decode[state.Status](val); err != nil {
			return w, false, fmt.Errorf("read status: %w", err)
		}
	}
	return w, true, nil
}
