package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
)

// Event is the data of a "status" event of GET
// /api/v1/sessions/{id}/events: a change of the session's phase, reason
// or message. Warnings come as WarningEvents.
type Event struct {
	Session string      `json:"session"`
	Phase   state.Phase `json:"phase"`
	Reason  string      `json:"reason,omitempty"`
	// Message is the change in plain words, e.g. "Pending: waiting for
	// 2×A100: the best node has 1 free; 3 sessions ahead of you".
	Message string `json:"message"`
	// Progress is a rough percentage for progress bars (JupyterHub's
	// spawner relays it): 10 pending, 40 bound, 70 starting, 100 running
	// or ended.
	Progress int `json:"progress"`
	// Terminal is true for the last event of the stream.
	Terminal bool         `json:"terminal"`
	Status   state.Status `json:"status"`
}

// heartbeat keeps idle event streams open through proxies.
const heartbeat = 15 * time.Second

func progressOf(p state.Phase) int {
	switch p {
	case state.PhasePending:
		return 10
	case state.PhaseBound:
		return 40
	case state.PhaseStarting:
		return 70
	}
	return 100
}

func plainMessage(st state.Status) string {
	msg := string(st.Phase)
	if st.Message != "" {
		msg += ": " + st.Message
	} else if st.Reason != "" {
		msg += ": " + st.Reason
	}
	if st.ExitCode != nil && st.Phase.Terminal() {
		msg += fmt.Sprintf(" (exit code %d)", *st.ExitCode)
	}
	return msg
}

// Event types of GET /api/v1/sessions/{id}/events (the SSE "event:" field).
const (
	// EventStatus carries an Event: a change of phase, reason or message.
	EventStatus = "status"
	// EventWarning carries a WarningEvent: the system will stop the session.
	EventWarning = "warning"
	// EventWarningWithdrawn carries a WarningEvent: a warning's cause went
	// away and the session keeps running.
	EventWarningWithdrawn = "warning-withdrawn"
)

// WarningEvent is the data of the "warning" and "warning-withdrawn"
// events. Its session, phase, reason, message and terminal fields mean
// what an Event's do, so a client that reads every event's data as an
// Event sees a live, non-terminal one and goes on.
type WarningEvent struct {
	Session string `json:"session"`
	// Phase is the session's phase when the event was sent.
	Phase state.Phase `json:"phase"`
	// Reason is the warning's: IdleTimeout, MaxRuntime, NodeDrained,
	// Preempted or Resized (an elastic job's resize).
	Reason string `json:"reason"`
	// Message says it in plain words, e.g. "will be stopped at 10:15 UTC:
	// idle for 2h (no Jupyter activity, no busy kernel, GPUs idle)", or
	// for a withdrawn warning "the IdleTimeout warning is withdrawn: it
	// will not be stopped at 10:15 UTC (activity resumed)".
	Message string `json:"message"`
	// StopAt is when the session will be stopped; absent when withdrawn.
	StopAt *time.Time `json:"stopAt,omitempty"`
	// Terminal is always false: a warning never ends the stream.
	Terminal bool `json:"terminal"`
	// Warning is the record as stored at warnings/<id>; for
	// warning-withdrawn, the one withdrawn.
	Warning state.Warning `json:"warning"`
}

// clockText writes t for a message: "10:15 UTC" when it falls on the
// same UTC day as now, else "2026-11-23 10:15 UTC".
func clockText(t, now time.Time) string {
	t, now = t.UTC(), now.UTC()
	if t.YearDay() == now.YearDay() && t.Year() == now.Year() {
		return t.Format("15:04 UTC")
	}
	return t.Format("2006-01-02 15:04 UTC")
}

// warningMessage is a warning in plain words.
func warningMessage(w state.Warning, now time.Time) string {
	why := w.Message
	if why == "" {
		why = w.Reason
	}
	return "will be stopped at " + clockText(w.StopAt, now) + ": " + why
}

// withdrawnMessage says that w no longer applies, with its likely cause.
func withdrawnMessage(w state.Warning, now time.Time) string {
	msg := fmt.Sprintf("the %s warning is withdrawn", w.Reason)
	if !w.StopAt.IsZero() {
		msg += ": it will not be stopped at " + clockText(w.StopAt, now)
	}
	switch w.Reason {
	case state.ReasonIdle:
		msg += " (activity resumed)"
	case state.ReasonMaxRuntime:
		msg += " (its max runtime was extended)"
	case state.ReasonDrained:
		msg += " (its node is no longer drained)"
	case state.ReasonPreempted:
		msg += " (the preemption was called off)"
	case state.ReasonResized:
		msg += " (the resize is under way, or no longer needed)"
	}
	return msg
}

// eventStream is one client's event stream: what it has sent, so that
// repeats are left out, and the session's phase, for warning events.
type eventStream struct {
	a     *API
	c     *gin.Context
	w     gin.ResponseWriter
	id    string
	owner string

	last     *Event      // the last status event sent
	phase    state.Phase // the phase of the last status seen
	lastWarn []byte      // the value of the last warning sent; nil: none
	failed   bool        // a write to the client failed
}

// write sends one SSE event; it returns false when the client is gone.
func (s *eventStream) write(typ string, rev int64, data any) bool {
	b, _ := json.Marshal(data)
	if _, err := fmt.Fprintf(s.w, "id: %d\nevent: %s\ndata: %s\n\n", rev, typ, b); err != nil {
		s.failed = true
		return false
	}
	s.w.Flush()
	return true
}

// status sends st unless it repeats the last status event; it returns
// true when the stream should end (a terminal phase, or the client left).
func (s *eventStream) status(st state.Status, rev int64) bool {
	s.phase = st.Phase
	st = s.a.presentStatus(s.c, s.owner, st)
	ev := Event{Session: s.id, Phase: st.Phase, Reason: st.Reason, Message: plainMessage(st), Progress: progressOf(st.Phase), Terminal: st.Phase.Terminal(), Status: st}
	if s.last != nil && s.last.Phase == ev.Phase && s.last.Reason == ev.Reason && s.last.Message == ev.Message {
		return false
	}
	s.last = &ev
	return !s.write(EventStatus, rev, ev) || ev.Terminal
}

// warning sends a warning put at rev unless it repeats the last one sent.
func (s *eventStream) warning(value []byte, rev int64) bool {
	if s.lastWarn != nil && string(s.lastWarn) == string(value) {
		return false
	}
	w, err := state.Decode[state.Warning](value)
	if err != nil {
		return false
	}
	s.lastWarn = value
	stopAt := w.StopAt
	return !s.write(EventWarning, rev, WarningEvent{Session: s.id, Phase: s.phase, Reason: w.Reason,
		Message: warningMessage(w, s.a.cfg.Now()), StopAt: &stopAt, Warning: w})
}

// withdrawn handles the deletion of the warning prev at rev: a
// "warning-withdrawn" event while the session still runs. A warning
// deleted because the session is being stopped (the controller's eviction,
// its owner's stop) or has ended is not withdrawn: status events follow.
func (s *eventStream) withdrawn(ctx context.Context, prev *state.Warning, rev int64) bool {
	s.lastWarn = nil
	// The spec and status as of the deletion, not as of now: a stop
	// asked a moment later must not hide a withdrawal that happened.
	resp, err := s.a.cli.Txn(ctx).Then(
		clientv3.OpGet(s.a.keys.Session(s.id), clientv3.WithRev(rev)),
		clientv3.OpGet(s.a.keys.Status(s.id), clientv3.WithRev(rev)),
	).Commit()
	if errors.Is(err, rpctypes.ErrCompacted) {
		resp, err = s.a.cli.Txn(ctx).Then(clientv3.OpGet(s.a.keys.Session(s.id)), clientv3.OpGet(s.a.keys.Status(s.id))).Commit()
	}
	if err != nil {
		return false // the stream goes on; the status events will tell
	}
	specs, sts := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	if len(specs) == 0 {
		return false
	}
	spec, err := state.Decode[state.Session](specs[0].Value)
	if err != nil || spec.Stopping() {
		return false
	}
	if len(sts) > 0 {
		if st, err := state.Decode[state.Status](sts[0].Value); err == nil && (st.Phase.Terminal() || st.Phase == state.PhaseStopping) {
			return false
		}
	}
	w := state.Warning{Session: s.id}
	if prev != nil {
		w = *prev
	}
	return !s.write(EventWarningWithdrawn, rev, WarningEvent{Session: s.id, Phase: s.phase, Reason: w.Reason,
		Message: withdrawnMessage(w, s.a.cfg.Now()), Warning: w})
}

// snapshot reads the status and the warning at one revision and sends
// what changed since the last events sent: the current status (the first
// event of a fresh stream), then the warning if there is one, or its
// withdrawal if one was sent and is gone (after a compaction). It returns
// the revision read, to watch from, and whether the stream should end.
func (s *eventStream) snapshot(ctx context.Context) (int64, bool, error) {
	resp, err := s.a.cli.Txn(ctx).Then(clientv3.OpGet(s.a.keys.Status(s.id)), clientv3.OpGet(s.a.keys.Warning(s.id))).Commit()
	if err != nil {
		return 0, false, fmt.Errorf("read session %s events: %w", s.id, err)
	}
	rev := resp.Header.Revision
	var statusRev int64
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		statusRev = kvs[0].ModRevision
		if st, err := state.Decode[state.Status](kvs[0].Value); err == nil && s.status(st, statusRev) {
			return rev, true, nil
		}
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		// Event ids stay in order: a client resuming after this one has
		// seen both keys as they are now.
		if s.warning(kvs[0].Value, max(kvs[0].ModRevision, statusRev)) {
			return rev, true, nil
		}
	} else if s.lastWarn != nil {
		var prev *state.Warning
		if w, err := state.Decode[state.Warning](s.lastWarn); err == nil {
			prev = &w
		}
		if s.withdrawn(ctx, prev, rev) {
			return rev, true, nil
		}
	}
	return rev, s.failed, nil
}

// resumeAt sets what a client resuming after revision rev has seen: the
// session's phase then (warning events carry it; phase if it cannot be
// read) and the warning then (not sent again if rewritten unchanged).
func (s *eventStream) resumeAt(ctx context.Context, rev int64, phase state.Phase) {
	s.phase = phase
	resp, err := s.a.cli.Txn(ctx).Then(
		clientv3.OpGet(s.a.keys.Status(s.id), clientv3.WithRev(rev)),
		clientv3.OpGet(s.a.keys.Warning(s.id), clientv3.WithRev(rev)),
	).Commit()
	if err != nil { // compacted, or a revision from the future: start afresh
		return
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		if st, err := state.Decode[state.Status](kvs[0].Value); err == nil {
			s.phase = st.Phase
		}
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		s.lastWarn = kvs[0].Value
	}
}

// sessionEvents streams the session's status changes and lifecycle
// warnings as Server-Sent Events, from watches on status/<id> and
// warnings/<id>: one "status" event for the current status (and a
// "warning" event if there is a warning), then one event per change of
// phase, reason or message, per warning issued or changed, and per
// warning withdrawn while the session runs ("warning-withdrawn"), in the
// order of their etcd revisions, until a terminal phase (the last event
// has terminal: true) or the client leaves. Each event's id is the etcd
// revision of the change; a client reconnecting with Last-Event-ID
// resumes after it.
func (a *API) sessionEvents(c *gin.Context) {
	v, ok := a.loadVisible(c)
	if !ok {
		return
	}
	ctx, done := a.streamContext(c)
	defer done()
	var after int64
	if le := c.GetHeader("Last-Event-ID"); le != "" {
		n, err := strconv.ParseInt(le, 10, 64)
		if err != nil || n < 0 {
			a.invalid(c, "Invalid request", []FieldError{{Field: "header Last-Event-ID", Message: "want the id of an event of this stream (a revision number)"}})
			return
		}
		after = n
	}
	w := c.Writer
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	w.Flush()

	s := &eventStream{a: a, c: c, w: w, id: v.ID, owner: v.Owner}
	rev := after
	if after == 0 {
		r, end, err := s.snapshot(ctx)
		if err != nil || end {
			return
		}
		rev = r
	} else {
		s.resumeAt(ctx, after, v.Status.Phase)
	}
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	for ctx.Err() == nil {
		end, relist := s.follow(ctx, tick, &rev)
		if end {
			return
		}
		if relist {
			r, end, err := s.snapshot(ctx)
			if err != nil || end {
				return
			}
			rev = r
		}
		if ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond): // a broken stream: brief pause, then watch again
			}
		}
	}
}

// Sources of the merged watch.
const (
	srcStatus  = 0
	srcWarning = 1
)

// pendingEvent is a watch event held until the other watch has caught up
// with its revision.
type pendingEvent struct {
	src int
	ev  *clientv3.Event
}

// orderWait bounds how long an event waits for the other watch to confirm
// it has nothing older (a server that does not answer progress requests).
const orderWait = 2 * time.Second

// progressEvery is how often a held event asks again for progress.
const progressEvery = 20 * time.Millisecond

// follow relays the watches of status/<id> and warnings/<id> from *rev+1,
// merged into revision order: an event of one watch goes out once the
// other has shown (by an event or a progress notification, requested on
// the spot) that it holds nothing older, so a warning written before a
// stop always precedes the stop's status events. On return *rev is a
// revision up to which everything was sent. It returns end when the
// stream should end, and relist when a watch revision was compacted away.
func (s *eventStream) follow(ctx context.Context, tick *time.Ticker, rev *int64) (end, relist bool) {
	// A watcher of its own gives the two watches a gRPC stream of their
	// own: etcd answers a progress request only when every watcher on the
	// stream has caught up (and drops it otherwise), so other clients'
	// watches must not share it.
	wt := clientv3.NewWatcher(s.a.cli)
	defer wt.Close()
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	chans := [2]clientv3.WatchChan{
		wt.Watch(wctx, s.a.keys.Status(s.id), clientv3.WithRev(*rev+1)),
		wt.Watch(wctx, s.a.keys.Warning(s.id), clientv3.WithRev(*rev+1), clientv3.WithPrevKV()),
	}
	seen := [2]int64{*rev, *rev} // each watch has delivered everything up to here
	var held []pendingEvent
	var waitSince time.Time
	var waitTimer <-chan time.Time
	// While an event is held, progress is asked for again and again: etcd
	// drops a request that arrives while a watcher is still catching up.
	ask := time.NewTicker(progressEvery)
	defer ask.Stop()
	defer func() {
		// Resume where nothing unsent is lost; repeats are left out.
		r := min(seen[0], seen[1])
		if len(held) > 0 {
			r = min(r, held[0].ev.Kv.ModRevision-1)
		}
		*rev = max(*rev, r)
	}()
	for {
		// Send what is in order: the oldest held event, once the other
		// watch has passed its revision (a warning goes first on a tie).
		for len(held) > 0 {
			p := held[0]
			r := p.ev.Kv.ModRevision
			if seen[1-p.src] < r && (waitSince.IsZero() || time.Since(waitSince) < orderWait) {
				break
			}
			held, waitSince = held[1:], time.Time{}
			if s.emit(ctx, p) {
				return true, false
			}
			if p.src == srcStatus {
				*rev = max(*rev, r)
			} else {
				*rev = max(*rev, r-1)
			}
		}
		var askC <-chan time.Time
		if len(held) > 0 {
			if waitSince.IsZero() {
				_ = wt.RequestProgress(wctx) // an error: the watch's own error follows
				waitSince = time.Now()
				waitTimer = time.After(orderWait)
				ask.Reset(progressEvery)
			}
			askC = ask.C
		} else {
			waitTimer = nil
		}
		var resp clientv3.WatchResponse
		var src int
		var ok bool
		select {
		case <-ctx.Done():
			return true, false
		case <-waitTimer:
			continue // the head event has waited long enough: send it
		case <-askC:
			_ = wt.RequestProgress(wctx)
			continue
		case <-tick.C:
			if _, err := fmt.Fprint(s.w, ": keepalive\n\n"); err != nil {
				return true, false
			}
			s.w.Flush()
			continue
		case resp, ok = <-chans[srcStatus]:
			src = srcStatus
		case resp, ok = <-chans[srcWarning]:
			src = srcWarning
		}
		if !ok {
			return false, false
		}
		if err := resp.Err(); err != nil {
			return false, errors.Is(err, rpctypes.ErrCompacted)
		}
		if resp.IsProgressNotify() {
			seen[src] = max(seen[src], resp.Header.Revision)
			continue
		}
		for _, ev := range resp.Events {
			seen[src] = max(seen[src], ev.Kv.ModRevision)
			held = insertHeld(held, pendingEvent{src: src, ev: ev})
		}
	}
}

// insertHeld adds p to held, kept in revision order with warnings before
// statuses of the same revision.
func insertHeld(held []pendingEvent, p pendingEvent) []pendingEvent {
	i := len(held)
	for i > 0 {
		q := held[i-1]
		if q.ev.Kv.ModRevision < p.ev.Kv.ModRevision || (q.ev.Kv.ModRevision == p.ev.Kv.ModRevision && q.src >= p.src) {
			break
		}
		i--
	}
	held = append(held, pendingEvent{})
	copy(held[i+1:], held[i:])
	held[i] = p
	return held
}

// emit sends one watch event as a stream event; it returns true when the
// stream should end.
func (s *eventStream) emit(ctx context.Context, p pendingEvent) bool {
	ev := p.ev
	switch {
	case p.src == srcStatus && ev.Type == clientv3.EventTypePut:
		st, err := state.Decode[state.Status](ev.Kv.Value)
		if err != nil {
			return false
		}
		return s.status(st, ev.Kv.ModRevision)
	case p.src == srcWarning && ev.Type == clientv3.EventTypePut:
		return s.warning(ev.Kv.Value, ev.Kv.ModRevision)
	case p.src == srcWarning && ev.Type == clientv3.EventTypeDelete:
		var prev *state.Warning
		if ev.PrevKv != nil {
			if w, err := state.Decode[state.Warning](ev.PrevKv.Value); err == nil {
				prev = &w
			}
		}
		return s.withdrawn(ctx, prev, ev.Kv.ModRevision)
	}
	return false
}

// presentStatus is present for a status alone, as stored: events report
// what the placer and agents wrote, not the API's live queue view.
func (a *API) presentStatus(c *gin.Context, owner string, st state.Status) state.Status {
	return a.presentAs(principalOf(c), SessionView{Session: state.Session{ID: st.Session, Owner: owner}, Status: st}, false).Status
}
