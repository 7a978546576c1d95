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

// Event is one Server-Sent Event of GET /api/v1/sessions/{id}/events:
// a change of the session's phase, reason or message.
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

// sessionEvents streams the session's status changes as Server-Sent
// Events, from a watch on status/<id>: one event for the current status,
// then one per change of phase, reason or message, until a terminal phase
// (the last event has terminal: true) or the client leaves. Each event's
// id is the etcd revision of the change; a client reconnecting with
// Last-Event-ID resumes after it.
func (a *API) sessionEvents(c *gin.Context) {
	v, ok := a.loadVisible(c)
	if !ok {
		return
	}
	ctx, done := a.streamContext(c)
	defer done()
	key := a.keys.Status(v.ID)
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

	var last *Event
	send := func(st state.Status, rev int64) bool {
		st = a.presentStatus(c, v.Owner, st)
		ev := Event{Session: v.ID, Phase: st.Phase, Reason: st.Reason, Message: plainMessage(st), Progress: progressOf(st.Phase), Terminal: st.Phase.Terminal(), Status: st}
		if last != nil && last.Phase == ev.Phase && last.Reason == ev.Reason && last.Message == ev.Message {
			return false
		}
		last = &ev
		b, _ := json.Marshal(ev)
		if _, err := fmt.Fprintf(w, "id: %d\nevent: status\ndata: %s\n\n", rev, b); err != nil {
			return true
		}
		w.Flush()
		return ev.Terminal
	}
	// current reads the status now and sends it; it returns the revision
	// to watch from.
	current := func() (int64, bool, error) {
		resp, err := a.cli.Get(ctx, key)
		if err != nil {
			return 0, false, err
		}
		if len(resp.Kvs) == 0 {
			return resp.Header.Revision, false, nil
		}
		st, err := state.Decode[state.Status](resp.Kvs[0].Value)
		if err != nil {
			return resp.Header.Revision, false, nil
		}
		return resp.Header.Revision, send(st, resp.Kvs[0].ModRevision), nil
	}
	rev := after
	if after == 0 {
		r, done, err := current()
		if err != nil || done {
			return
		}
		rev = r
	}
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := a.cli.Watch(wctx, key, clientv3.WithRev(rev+1))
		done, relist := a.pump(ctx, wch, tick, &rev, send, w)
		cancel()
		if done {
			return
		}
		if relist {
			r, done, err := current()
			if err != nil || done {
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

// pump relays one watch stream. It returns done when the stream should
// end, and relist when the watch revision was compacted away.
func (a *API) pump(ctx context.Context, wch clientv3.WatchChan, tick *time.Ticker, rev *int64, send func(state.Status, int64) bool, w gin.ResponseWriter) (done, relist bool) {
	for {
		select {
		case <-ctx.Done():
			return true, false
		case <-tick.C:
			if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil {
				return true, false
			}
			w.Flush()
		case resp, ok := <-wch:
			if !ok {
				return false, false
			}
			if err := resp.Err(); err != nil {
				return false, errors.Is(err, rpctypes.ErrCompacted)
			}
			for _, ev := range resp.Events {
				*rev = ev.Kv.ModRevision
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				st, err := state.Decode[state.Status](ev.Kv.Value)
				if err != nil {
					continue
				}
				if send(st, ev.Kv.ModRevision) {
					return true, false
				}
			}
		}
	}
}

// presentStatus is present for a status alone, as stored: events report
// what the placer and agents wrote, not the API's live queue view.
func (a *API) presentStatus(c *gin.Context, owner string, st state.Status) state.Status {
	return a.presentAs(principalOf(c), SessionView{Session: state.Session{ID: st.Session, Owner: owner}, Status: st}, false).Status
}
