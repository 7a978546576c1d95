package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// sseEvent is one Server-Sent Event as read off the wire.
type sseEvent struct {
	typ, id string
	data    []byte
}

// eventReader follows a session's event stream.
type eventReader struct {
	t      *testing.T
	ctx    context.Context
	events chan sseEvent
}

// openEvents opens GET …/events for session id as tok, resuming after
// lastID when it is not empty. The stream closes with the test.
func (h *harness) openEvents(t *testing.T, id, tok, lastID string) *eventReader {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", h.srv.URL+"/api/v1/sessions/"+id+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("events: status %d", resp.StatusCode)
	}
	r := &eventReader{t: t, ctx: ctx, events: make(chan sseEvent)}
	go func() {
		defer resp.Body.Close()
		defer close(r.events)
		sc := bufio.NewScanner(resp.Body)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.data != nil {
					select {
					case r.events <- ev:
					case <-ctx.Done():
						return
					}
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, "event: "):
				ev.typ = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "id: "):
				ev.id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "data: "):
				ev.data = []byte(strings.TrimPrefix(line, "data: "))
			}
		}
	}()
	return r
}

// next returns the next event; it fails the test when the stream ends or
// nothing comes.
func (r *eventReader) next() sseEvent {
	r.t.Helper()
	select {
	case ev, ok := <-r.events:
		if !ok {
			r.t.Fatal("the stream ended early")
		}
		return ev
	case <-r.ctx.Done():
		r.t.Fatal("no event")
	}
	return sseEvent{}
}

// ended fails unless the stream ends with no further event.
func (r *eventReader) ended() {
	r.t.Helper()
	select {
	case ev, ok := <-r.events:
		if ok {
			r.t.Fatalf("an event after the terminal one: %s %s", ev.typ, ev.data)
		}
	case <-r.ctx.Done():
		r.t.Fatal("the stream did not end after the terminal event")
	}
}

func (e sseEvent) status(t *testing.T) api.Event {
	t.Helper()
	if e.typ != api.EventStatus {
		t.Fatalf("event %q (%s), want a status event", e.typ, e.data)
	}
	var ev api.Event
	if err := json.Unmarshal(e.data, &ev); err != nil {
		t.Fatal(err)
	}
	return ev
}

func (e sseEvent) warning(t *testing.T, typ string) api.WarningEvent {
	t.Helper()
	if e.typ != typ {
		t.Fatalf("event %q (%s), want %s", e.typ, e.data, typ)
	}
	var ev api.WarningEvent
	if err := json.Unmarshal(e.data, &ev); err != nil {
		t.Fatal(err)
	}
	return ev
}

// running makes a created session look bound and running since started,
// as the placer and agent would leave it.
func (h *harness) running(id string, started time.Time, act *state.Activity) {
	h.t.Helper()
	if _, err := h.cli.Delete(context.Background(), h.keys.Pending(id)); err != nil {
		h.t.Fatal(err)
	}
	h.putStatus(state.Status{Session: id, Phase: state.PhaseRunning, Reason: "Started", Message: "Jupyter answers", Nodes: []string{"gpu-1"}, Started: &started, Activity: act})
}

func (h *harness) putWarning(w state.Warning) {
	h.t.Helper()
	if _, err := state.Put(context.Background(), h.cli, h.keys.Warning(w.Session), w); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) deleteWarning(id string) {
	h.t.Helper()
	if _, err := h.cli.Delete(context.Background(), h.keys.Warning(id)); err != nil {
		h.t.Fatal(err)
	}
}

// evict writes the lifecycle controller's eviction into the spec.
func (h *harness) evict(id, reason string) {
	h.t.Helper()
	s, _, err := state.Get[state.Session](context.Background(), h.cli, h.keys.Session(id))
	if err != nil {
		h.t.Fatal(err)
	}
	s.Eviction = &state.Eviction{Reason: reason, Message: "stopped at its max runtime of 8h0m0s", At: time.Now().UTC()}
	if _, err := state.Put(context.Background(), h.cli, h.keys.Session(id), s); err != nil {
		h.t.Fatal(err)
	}
}

func TestExtendSession(t *testing.T) {
	h := newHarness(t, harnessOpts{maxRuntime: 8 * time.Hour, maxRuntimeCap: 24 * time.Hour})
	ada, bob, hub := h.token("ada"), h.token("bob"), h.token("jupyterhub", "service")
	create := func() api.SessionView {
		t.Helper()
		return decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, notebook()), http.StatusCreated))
	}
	extend := func(id, tok, by string, code int, headers ...string) response {
		t.Helper()
		return want(t, h.do("POST", "/api/v1/sessions/"+id+"/extend", tok, map[string]any{"by": by}, headers...), code)
	}
	stored := func(id string) time.Duration {
		t.Helper()
		s, _, err := state.Get[state.Session](context.Background(), h.cli, h.keys.Session(id))
		if err != nil {
			t.Fatal(err)
		}
		return s.Limits.MaxRuntime.Std()
	}

	v := create()
	started := time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)
	h.running(v.ID, started, nil)
	g := decode[api.SessionView](t, want(t, h.do("GET", "/api/v1/sessions/"+v.ID, ada, nil), http.StatusOK))
	if g.RunsUntil == nil || !g.RunsUntil.Equal(started.Add(8*time.Hour)) {
		t.Fatalf("runsUntil %v, want the start plus the cluster default of 8h", g.RunsUntil)
	}

	// The cluster default (8h) plus 2h, written into the spec.
	e := decode[api.SessionView](t, extend(v.ID, ada, "2h", http.StatusOK))
	if e.Limits.MaxRuntime.Std() != 10*time.Hour || stored(v.ID) != 10*time.Hour {
		t.Errorf("after +2h: answered %s, stored %s, want 10h", e.Limits.MaxRuntime.Std(), stored(v.ID))
	}
	if e.RunsUntil == nil || !e.RunsUntil.Equal(started.Add(10*time.Hour)) {
		t.Errorf("runsUntil %v after +2h, want %v", e.RunsUntil, started.Add(10*time.Hour))
	}
	// Over the cap: what may still be added is named.
	p := extend(v.ID, ada, "20h", http.StatusUnprocessableEntity).problem(t)
	if p.Detail != "the cluster caps max runtime at 24h0m0s and this session's limit is 10h0m0s, so at most 14h0m0s may still be added; got 20h0m0s" ||
		len(p.Errors) != 1 || p.Errors[0].Field != "by" || p.Errors[0].Message != "want at most 14h0m0s" {
		t.Errorf("over the cap: %+v", p)
	}
	if stored(v.ID) != 10*time.Hour {
		t.Error("a refused extension changed the spec")
	}
	// Up to the cap exactly, by the service on the owner's behalf; then nothing more.
	extend(v.ID, hub, "14h", http.StatusOK, api.OnBehalfOfHeader, "ada")
	p = extend(v.ID, ada, "1m", http.StatusUnprocessableEntity).problem(t)
	if p.Detail != "the cluster caps max runtime at 24h0m0s and this session's limit is 24h0m0s already: nothing more may be added" {
		t.Errorf("at the cap: %q", p.Detail)
	}

	for _, tc := range []struct {
		name, tok, body string
		code            int
		detail          string
	}{
		{"another user", bob, `{"by":"1h"}`, 404, fmt.Sprintf("no session %q", v.ID)},
		{"zero", ada, `{"by":"0s"}`, 422, `by: got 0s, want a positive duration such as "2h"`},
		{"negative", ada, `{"by":"-1h"}`, 422, `by: got -1h0m0s, want a positive duration such as "2h"`},
		{"missing", ada, `{}`, 422, `by: got 0s, want a positive duration such as "2h"`},
		{"not a duration", ada, `{"by":"later"}`, 400, `parse duration "later": want a Go duration such as "90m" or "2h": time: invalid duration "later"`},
		{"unknown field", ada, `{"for":"1h"}`, 400, `unknown field "for"; the fields are listed in /openapi.json`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := want(t, h.do("POST", "/api/v1/sessions/"+v.ID+"/extend", tc.tok, tc.body), tc.code).problem(t)
			if p.Detail != tc.detail {
				t.Errorf("detail %q\nwant   %q", p.Detail, tc.detail)
			}
		})
	}

	// Stopping and ended sessions have nothing to extend.
	s2 := create()
	h.running(s2.ID, started, nil)
	want(t, h.do("POST", "/api/v1/sessions/"+s2.ID+"/stop", ada, nil), http.StatusAccepted)
	p = extend(s2.ID, ada, "1h", http.StatusConflict).problem(t)
	if p.Detail != "session "+s2.ID+" is stopping (its owner asked it to stop): there is nothing to extend" {
		t.Errorf("stopping: %q", p.Detail)
	}
	s3 := create()
	h.running(s3.ID, started, nil)
	h.evict(s3.ID, state.ReasonMaxRuntime)
	p = extend(s3.ID, ada, "1h", http.StatusConflict).problem(t)
	if p.Detail != "session "+s3.ID+" is stopping (it is being stopped: MaxRuntime (stopped at its max runtime of 8h0m0s)): there is nothing to extend" {
		t.Errorf("evicted: %q", p.Detail)
	}
	s4 := create()
	code := 0
	h.putStatus(state.Status{Session: s4.ID, Phase: state.PhaseStopped, Reason: "Stopped", ExitCode: &code})
	p = extend(s4.ID, ada, "1h", http.StatusConflict).problem(t)
	if p.Detail != "session "+s4.ID+" has ended (Stopped): there is nothing to extend" {
		t.Errorf("ended: %q", p.Detail)
	}

	// A pending session's own limit is extended too.
	lim := notebook()
	lim["limits"] = map[string]any{"maxRuntime": "3h"}
	s5 := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, lim), http.StatusCreated))
	if e := decode[api.SessionView](t, extend(s5.ID, ada, "90m", http.StatusOK)); e.Limits.MaxRuntime.Std() != 4*time.Hour+30*time.Minute || e.RunsUntil != nil {
		t.Errorf("pending: limit %s, runsUntil %v; want 4h30m and none before it starts", e.Limits.MaxRuntime.Std(), e.RunsUntil)
	}
}

// TestExtendConcurrent runs extensions of one session at once: each
// conditional write that loses a race reads again, so none is lost.
func TestExtendConcurrent(t *testing.T) {
	h := newHarness(t, harnessOpts{maxRuntime: time.Hour})
	ada := h.token("ada")
	v := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, notebook()), http.StatusCreated))
	const n = 8
	var wg sync.WaitGroup
	codes := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i] = h.do("POST", "/api/v1/sessions/"+v.ID+"/extend", ada, map[string]any{"by": "1h"}).status
		}()
	}
	wg.Wait()
	for i, c := range codes {
		if c != http.StatusOK {
			t.Errorf("extension %d: status %d", i, c)
		}
	}
	s, _, err := state.Get[state.Session](context.Background(), h.cli, h.keys.Session(v.ID))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Limits.MaxRuntime.Std(); got != (1+n)*time.Hour {
		t.Errorf("max runtime %s after %d concurrent +1h on a 1h default, want %s", got, n, (1+n)*time.Hour)
	}
}

func TestExtendWithoutMaxRuntime(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ada := h.token("ada")
	v := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, notebook()), http.StatusCreated))
	p := want(t, h.do("POST", "/api/v1/sessions/"+v.ID+"/extend", ada, map[string]any{"by": "1h"}), http.StatusConflict).problem(t)
	if p.Detail != "session "+v.ID+" has no max runtime (neither its limits nor the cluster default set one): it may already run as long as it likes, so there is nothing to extend" {
		t.Errorf("detail %q", p.Detail)
	}
	if g := decode[api.SessionView](t, want(t, h.do("GET", "/api/v1/sessions/"+v.ID, ada, nil), http.StatusOK)); g.Limits.MaxRuntime != 0 {
		t.Errorf("limit %s written", g.Limits.MaxRuntime.Std())
	}
}

func TestCreateLimitsAndRestart(t *testing.T) {
	h := newHarness(t, harnessOpts{maxRuntimeCap: 24 * time.Hour})
	ada, root := h.token("ada"), h.token("root", "admin")
	// A profile above the cap is refused when written...
	p := want(t, h.do("PUT", "/api/v1/profiles/long", root, map[string]any{"kind": "notebook", "limits": map[string]any{"maxRuntime": "48h"}}), http.StatusUnprocessableEntity).problem(t)
	if p.Detail != "limits.maxRuntime: got 48h0m0s, above the cluster's cap of 24h0m0s (VOYAGER_MAX_RUNTIME_CAP); want at most 24h0m0s" {
		t.Errorf("profile above the cap: %q", p.Detail)
	}
	// ...and one written before the cap was lowered is refused when used.
	if _, err := state.Put(context.Background(), h.cli, h.keys.Profile("long"), state.Profile{Name: "long", Kind: state.KindNotebook, Limits: state.Limits{MaxRuntime: state.Duration(48 * time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	want(t, h.do("PUT", "/api/v1/profiles/small", root, map[string]any{"kind": "notebook", "limits": map[string]any{"maxRuntime": "4h", "idleTimeout": "1h"}}), http.StatusOK)

	body := func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	tests := []struct {
		name   string
		body   map[string]any
		detail string       // a 422's detail, or "" for a 201
		limits state.Limits // of the created session
	}{
		{"request above the cap", body("kind", "notebook", "limits", map[string]any{"maxRuntime": "48h"}),
			"limits.maxRuntime: got 48h0m0s, above the cluster's cap of 24h0m0s; want at most 24h0m0s", state.Limits{}},
		{"request at the cap", body("kind", "notebook", "limits", map[string]any{"maxRuntime": "24h"}),
			"", state.Limits{MaxRuntime: state.Duration(24 * time.Hour)}},
		{"profile above the cap", body("profile", "long"),
			`limits.maxRuntime: profile "long" sets 48h0m0s, above the cluster's cap of 24h0m0s; ask for at most 24h0m0s, or ask an admin to fix the profile`, state.Limits{}},
		{"request lowers the profile's limit below the cap", body("profile", "long", "limits", map[string]any{"maxRuntime": "12h"}),
			"", state.Limits{MaxRuntime: state.Duration(12 * time.Hour)}},
		{"request's maxRuntime keeps the profile's idleTimeout", body("profile", "small", "limits", map[string]any{"maxRuntime": "6h"}),
			"", state.Limits{MaxRuntime: state.Duration(6 * time.Hour), IdleTimeout: state.Duration(time.Hour)}},
		{"request's idleTimeout keeps the profile's maxRuntime", body("profile", "small", "limits", map[string]any{"idleTimeout": "30m"}),
			"", state.Limits{MaxRuntime: state.Duration(4 * time.Hour), IdleTimeout: state.Duration(30 * time.Minute)}},
		{"a batch session from a notebook profile drops its idleTimeout", body("profile", "small", "kind", "batch", "command", []string{"true"}),
			"", state.Limits{MaxRuntime: state.Duration(4 * time.Hour)}},
		{"OnFailure without maxRestarts", body("kind", "batch", "command", []string{"true"}, "restart", map[string]any{"policy": "OnFailure"}),
			`restart.maxRestarts: required with policy "OnFailure": want 1 to 100 restarts`, state.Limits{}},
		{"OnFailure with maxRestarts", body("kind", "batch", "command", []string{"true"}, "restart", map[string]any{"policy": "OnFailure", "maxRestarts": 2, "backoff": "10s"}),
			"", state.Limits{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.detail != "" {
				p := want(t, h.do("POST", "/api/v1/sessions", ada, tc.body), http.StatusUnprocessableEntity).problem(t)
				if p.Detail != tc.detail {
					t.Errorf("detail %q\nwant   %q", p.Detail, tc.detail)
				}
				return
			}
			v := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, tc.body), http.StatusCreated))
			if v.Limits != tc.limits {
				t.Errorf("limits %+v, want %+v", v.Limits, tc.limits)
			}
		})
	}
}

func TestSessionViewShowsWarningAndActivity(t *testing.T) {
	h := newHarness(t, harnessOpts{maxRuntime: 8 * time.Hour})
	ada := h.token("ada")
	v := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, notebook()), http.StatusCreated))
	other := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, notebook()), http.StatusCreated))
	started := time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)
	idle := started.Add(20 * time.Minute)
	act := &state.Activity{LastActive: started.Add(10 * time.Minute), Sampled: started.Add(3 * time.Hour),
		Jupyter: &state.JupyterActivity{LastActivity: started.Add(10 * time.Minute), Kernels: 1, Connections: 1},
		GPUs:    []state.GPUActivity{{UUID: "GPU-gpu-1-0", IdleSince: &idle, Unused: true, Simulated: true}}}
	h.running(v.ID, started, act)
	w := state.Warning{Session: v.ID, Reason: state.ReasonIdle, Message: "idle since 09:10 (no Jupyter activity, no busy kernel, no busy GPU; idle timeout 2h0m0s)",
		Issued: started.Add(2*time.Hour + 10*time.Minute), StopAt: started.Add(2*time.Hour + 25*time.Minute)}
	h.putWarning(w)

	g := decode[api.SessionView](t, want(t, h.do("GET", "/api/v1/sessions/"+v.ID, ada, nil), http.StatusOK))
	if g.Warning == nil || g.Warning.Reason != w.Reason || g.Warning.Message != w.Message || !g.Warning.StopAt.Equal(w.StopAt) {
		t.Errorf("warning %+v, want %+v", g.Warning, w)
	}
	if a := g.Status.Activity; a == nil || a.Jupyter == nil || a.Jupyter.Kernels != 1 || len(a.GPUs) != 1 || !a.GPUs[0].Unused {
		t.Errorf("activity %+v", g.Status.Activity)
	}
	if g.RunsUntil == nil || !g.RunsUntil.Equal(started.Add(8*time.Hour)) {
		t.Errorf("runsUntil %v", g.RunsUntil)
	}
	l := decode[api.SessionList](t, want(t, h.do("GET", "/api/v1/sessions", ada, nil), http.StatusOK))
	for _, it := range l.Items {
		switch it.ID {
		case v.ID:
			if it.Warning == nil || it.Warning.Reason != state.ReasonIdle {
				t.Errorf("listed without its warning: %+v", it.Warning)
			}
		case other.ID:
			if it.Warning != nil || it.RunsUntil != nil {
				t.Errorf("a pending session listed with warning %+v, runsUntil %v", it.Warning, it.RunsUntil)
			}
		}
	}
	// Withdrawn: the view drops it at once (it is read with the spec).
	h.deleteWarning(v.ID)
	if g := decode[api.SessionView](t, want(t, h.do("GET", "/api/v1/sessions/"+v.ID, ada, nil), http.StatusOK)); g.Warning != nil {
		t.Errorf("warning %+v after its deletion", g.Warning)
	}
}

func TestWarningEvents(t *testing.T) {
	h := newHarness(t, harnessOpts{maxRuntime: 8 * time.Hour})
	ada := h.token("ada")
	v := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, notebook()), http.StatusCreated))
	started := time.Now().UTC().Add(-3 * time.Hour).Truncate(time.Second)
	h.running(v.ID, started, nil)

	s := h.openEvents(t, v.ID, ada, "")
	if ev := s.next().status(t); ev.Phase != state.PhaseRunning || ev.Terminal {
		t.Fatalf("first event %+v", ev)
	}
	stopAt := time.Date(2026, 11, 22, 10, 15, 0, 0, time.UTC)
	idle := state.Warning{Session: v.ID, Reason: state.ReasonIdle, Message: "idle for 2h (no Jupyter activity, no busy kernel, GPUs idle)", Issued: stopAt.Add(-15 * time.Minute), StopAt: stopAt}
	h.putWarning(idle)
	h.putWarning(idle) // rewritten unchanged: no second event
	later := idle
	later.StopAt = stopAt.Add(time.Hour)
	h.putWarning(later)
	h.deleteWarning(v.ID) // activity resumed while it runs

	e := s.next()
	we := e.warning(t, api.EventWarning)
	if we.Message != "will be stopped at "+clock(stopAt)+": idle for 2h (no Jupyter activity, no busy kernel, GPUs idle)" ||
		we.Phase != state.PhaseRunning || we.Reason != state.ReasonIdle || we.Terminal || we.StopAt == nil || !we.StopAt.Equal(stopAt) ||
		we.Warning.Message != idle.Message || we.Session != v.ID {
		t.Errorf("warning event %+v", we)
	}
	firstID := e.id
	e = s.next()
	if we := e.warning(t, api.EventWarning); !we.Warning.StopAt.Equal(later.StopAt) {
		t.Errorf("changed warning %+v", we)
	}
	e = s.next()
	wd := e.warning(t, api.EventWarningWithdrawn)
	if wd.Message != "the IdleTimeout warning is withdrawn: it will not be stopped at "+clock(later.StopAt)+" (activity resumed)" || wd.StopAt != nil || wd.Phase != state.PhaseRunning {
		t.Errorf("withdrawn event %+v", wd)
	}

	// Resuming after the first warning replays what followed it.
	r := h.openEvents(t, v.ID, ada, firstID)
	if we := r.next().warning(t, api.EventWarning); !we.Warning.StopAt.Equal(later.StopAt) || we.Phase != state.PhaseRunning {
		t.Errorf("resumed: %+v", we)
	}
	r.next().warning(t, api.EventWarningWithdrawn)

	// The controller stops it: a warning, the eviction, then the agent's
	// statuses. The warning goes out before the stop; an eviction is no
	// withdrawal, even when the warning is deleted before the session ends.
	mr := state.Warning{Session: v.ID, Reason: state.ReasonMaxRuntime, Message: "reaches its max runtime of 8h0m0s", Issued: time.Now().UTC(), StopAt: started.Add(8 * time.Hour)}
	h.putWarning(mr)
	h.evict(v.ID, state.ReasonMaxRuntime)
	h.deleteWarning(v.ID)
	h.putStatus(state.Status{Session: v.ID, Phase: state.PhaseStopping, Reason: state.ReasonMaxRuntime, Message: "stopping"})
	h.putStatus(state.Status{Session: v.ID, Phase: state.PhaseStopped, Reason: state.ReasonMaxRuntime, Message: "stopped at its max runtime of 8h0m0s"})
	for _, str := range []*eventReader{s, r} {
		if we := str.next().warning(t, api.EventWarning); we.Reason != state.ReasonMaxRuntime ||
			!strings.HasPrefix(we.Message, "will be stopped at "+clock(mr.StopAt)+": reaches its max runtime") {
			t.Errorf("max runtime warning %+v", we)
		}
		if ev := str.next().status(t); ev.Phase != state.PhaseStopping {
			t.Errorf("after the warning: %+v, want Stopping", ev)
		}
		if ev := str.next().status(t); ev.Phase != state.PhaseStopped || !ev.Terminal {
			t.Errorf("last: %+v, want the terminal Stopped", ev)
		}
		str.ended()
	}
}

// clock is how a stop time reads in a warning message sent now.
func clock(t time.Time) string {
	now := time.Now().UTC()
	if t.UTC().YearDay() == now.YearDay() && t.UTC().Year() == now.Year() {
		return t.UTC().Format("15:04 UTC")
	}
	return t.UTC().Format("2006-01-02 15:04 UTC")
}

// TestWarningPrecedesStop writes a warning and at once the terminal
// status, in separate writes and in one transaction, many times: the
// stream is ordered by revision, so the warning always comes first.
func TestWarningPrecedesStop(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ada := h.token("ada")
	for i := range 20 {
		v := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, notebook()), http.StatusCreated))
		h.running(v.ID, time.Now().UTC(), nil)
		t.Logf("round %d: %s", i, v.ID)
		s := h.openEvents(t, v.ID, ada, "")
		s.next().status(t)
		w := state.Warning{Session: v.ID, Reason: state.ReasonPreempted, Message: "preempted by s1", Issued: time.Now().UTC(), StopAt: time.Now().UTC().Add(time.Minute), By: "s1", Node: "gpu-1"}
		final := state.Status{Session: v.ID, Phase: state.PhaseStopped, Reason: state.ReasonPreempted, Message: "preempted"}
		if i%2 == 0 {
			h.putWarning(w)
			h.putStatus(final)
		} else {
			wb, _ := state.Encode(w)
			sb, _ := state.Encode(final)
			if _, err := h.cli.Txn(context.Background()).Then(clientv3.OpPut(h.keys.Status(v.ID), string(sb)), clientv3.OpPut(h.keys.Warning(v.ID), string(wb))).Commit(); err != nil {
				t.Fatal(err)
			}
		}
		e1, e2 := s.next(), s.next()
		if e1.typ != api.EventWarning || e2.typ != api.EventStatus {
			t.Fatalf("round %d: events %s then %s, want warning then status", i, e1.typ, e2.typ)
		}
		if ev := e2.status(t); !ev.Terminal {
			t.Fatalf("round %d: %+v", i, ev)
		}
		s.ended()
	}
}

func TestUnusedGPUsAndWarningMetrics(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ada, bob, root := h.token("ada"), h.token("bob"), h.token("root", "admin")
	h.addNode("gpu-1", "NVIDIA A100-SXM4-80GB", 3)
	h.addNode("gpu-2", "NVIDIA A100-SXM4-80GB", 1)
	idle := time.Date(2026, 11, 22, 9, 20, 0, 0, time.UTC)
	led := state.Ledger{Node: "gpu-1", Allocations: map[string]state.Allocation{
		"s1": {Owner: "ada", Role: state.RoleSingle, GPUs: []string{"GPU-gpu-1-0", "GPU-gpu-1-1"}},
		"s2": {Owner: "zed", Role: state.RoleSingle, GPUs: []string{"GPU-gpu-1-2"}},
	}}
	if _, err := state.Put(context.Background(), h.cli, h.keys.Ledger("gpu-1"), led); err != nil {
		t.Fatal(err)
	}
	h.putStatus(state.Status{Session: "s1", Phase: state.PhaseRunning, Activity: &state.Activity{GPUs: []state.GPUActivity{
		{UUID: "GPU-gpu-1-0", IdleSince: &idle, Unused: true},
		{UUID: "GPU-gpu-1-1", UtilizationPercent: 93, Processes: 1},
	}}})
	h.putStatus(state.Status{Session: "s2", Phase: state.PhaseRunning, Activity: &state.Activity{GPUs: []state.GPUActivity{
		{UUID: "GPU-gpu-1-2", IdleSince: &idle, Unused: true},
	}}})
	h.putWarning(state.Warning{Session: "s1", Reason: state.ReasonIdle, StopAt: idle.Add(time.Hour)})
	h.putWarning(state.Warning{Session: "s2", Reason: state.ReasonIdle, StopAt: idle.Add(time.Hour)})
	h.putWarning(state.Warning{Session: "s3", Reason: state.ReasonPreempted, StopAt: idle.Add(time.Hour)})

	type nodes struct{ Items []api.NodeSummary }
	h.waitFor("the unused GPUs in the node view", func() bool {
		return strings.Contains(string(h.do("GET", "/api/v1/nodes", root, nil).body), `"unused":2`)
	})
	n := decode[nodes](t, want(t, h.do("GET", "/api/v1/nodes", root, nil), http.StatusOK))
	if len(n.Items) != 2 {
		t.Fatalf("%d nodes", len(n.Items))
	}
	g1, g2 := n.Items[0], n.Items[1]
	if g1.GPUs != (api.GPUCounts{Total: 3, Used: 3, Free: 0, Unused: 2}) || g2.GPUs.Unused != 0 || g2.UnusedGPUs != nil {
		t.Errorf("counts %+v and %+v", g1.GPUs, g2.GPUs)
	}
	wantUnused := []api.UnusedGPU{{UUID: "GPU-gpu-1-0", Session: "s1", Owner: "ada", IdleSince: &idle}, {UUID: "GPU-gpu-1-2", Session: "s2", Owner: "zed", IdleSince: &idle}}
	if got, _ := json.Marshal(g1.UnusedGPUs); string(got) != mustJSON(t, wantUnused) {
		t.Errorf("admin sees unused %s\nwant %s", got, mustJSON(t, wantUnused))
	}
	// A user sees their own; others' are anonymous, as in the queue.
	n = decode[nodes](t, want(t, h.do("GET", "/api/v1/nodes", ada, nil), http.StatusOK))
	wantUnused[1].Session, wantUnused[1].Owner = "", "(another user)"
	if got, _ := json.Marshal(n.Items[0].UnusedGPUs); string(got) != mustJSON(t, wantUnused) {
		t.Errorf("ada sees unused %s", got)
	}
	n = decode[nodes](t, want(t, h.do("GET", "/api/v1/nodes", bob, nil), http.StatusOK))
	for _, u := range n.Items[0].UnusedGPUs {
		if u.Session != "" || u.Owner != "(another user)" {
			t.Errorf("bob sees %+v", u)
		}
	}

	h.waitFor("the warnings in the metrics", func() bool {
		m := gather(t, h.api)
		return strings.Contains(m, `voyager_session_warnings{reason="IdleTimeout"} 2`) && strings.Contains(m, `voyager_session_warnings{reason="Preempted"} 1`)
	})
	m := gather(t, h.api)
	for _, line := range []string{
		`voyager_gpus_allocated_unused{node="gpu-1"} 2`,
		`voyager_gpus_allocated_unused{node="gpu-2"} 0`,
		`voyager_session_warnings{reason="IdleTimeout"} 2`,
		`voyager_session_warnings{reason="Preempted"} 1`,
		`voyager_session_warnings{reason="MaxRuntime"} 0`,
		`voyager_session_warnings{reason="NodeDrained"} 0`,
	} {
		if !strings.Contains(m, line) {
			t.Errorf("metrics lack %s", line)
		}
	}
	// The OpenAPI document describes the warning events' data.
	doc := decode[map[string]any](t, want(t, h.do("GET", "/openapi.json", "", nil), http.StatusOK))
	schemas := doc["components"].(map[string]any)["schemas"].(map[string]any)
	for _, name := range []string{"WarningEvent", "ExtendRequest", "UnusedGPU", "Warning", "Activity"} {
		if schemas[name] == nil {
			t.Errorf("no %s schema in the OpenAPI document", name)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
