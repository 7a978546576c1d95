package nodeagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// Thresholds of a meaningful change of activity: smaller moves are not
// written to etcd.
const (
	utilChangePoints  = 10 // utilisation, percentage points
	memChangePercent  = 10 // memory in use, percent of the value last written
	jupyterBodyMaxLen = 1 << 20
)

// activity samples one running session's use (its head or single part):
// Jupyter's activity and the GPUs bound on this node. It lives in its
// worker's goroutine.
type activity struct {
	w      *worker
	sess   state.Session
	port   int      // Jupyter's port; 0: none
	bases  []string // Jupyter base URLs to try: the hub's prefix, then "/"
	tokens []string // tokens to try: the container's, then the hub server's
	good   [2]int   // the base and token that answered last
	client *http.Client

	seeded    bool
	started   time.Time
	last      *state.Activity      // last written
	idleSince map[string]time.Time // by GPU UUID
	warned    bool

	// reports is an elastic job's report directory on the host ("" for
	// others), size the GPUs it holds, and goodputAt when a changed
	// report last caused a write (goodput.go).
	reports   string
	size      int
	goodputAt time.Time
}

func (w *worker) newActivity(sess state.Session, info runtime.Info) *activity {
	timeout := min(max(w.a.cfg.ActivityEvery/2, time.Second), 5*time.Second)
	act := &activity{
		w: w, sess: sess, idleSince: map[string]time.Time{},
		client: &http.Client{Timeout: timeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
	}
	b := w.item.Value
	if _, ok := w.a.reportsMount(sess, w.id); ok {
		act.reports, act.size = w.a.reportsDir(w.id), len(b.GPUs)
	}
	if sess.Kind == state.KindNotebook && b.Role != state.RoleWorker {
		if p, err := SplitPorts(sess.Kind, b.Role, b.Ports); err == nil {
			act.port = p.Jupyter
		}
	}
	// JupyterHub's single-user server serves under its prefix and accepts
	// no JUPYTER_TOKEN, only tokens the hub vouches for: its own API token
	// (the hub's "server" role may access its user's servers) is one.
	if pre := strings.Trim(sess.Env["JUPYTERHUB_SERVICE_PREFIX"], "/"); pre != "" {
		act.bases = append(act.bases, "/"+pre+"/")
	}
	act.bases = append(act.bases, "/")
	for _, t := range []string{w.token, sess.Env["JUPYTER_TOKEN"], sess.Env["JUPYTERHUB_API_TOKEN"]} {
		if t != "" && !slices.Contains(act.tokens, t) {
			act.tokens = append(act.tokens, t)
		}
	}
	if len(act.tokens) == 0 {
		act.tokens = []string{""}
	}
	return act
}

// sample looks at the session once and writes its status's activity if it
// changed meaningfully since the last write (activityChanged).
func (act *activity) sample(ctx context.Context) {
	w := act.w
	cfg := w.a.cfg
	if !act.seeded && !act.seed(ctx) {
		return
	}
	w.a.activitySamples.Add(1)
	sctx, cancel := context.WithTimeout(ctx, act.client.Timeout)
	defer cancel()
	now := time.Now().UTC().Truncate(time.Second)
	cur := state.Activity{Sampled: now, LastActive: act.started}
	if act.last != nil && act.last.LastActive.After(cur.LastActive) {
		cur.LastActive = act.last.LastActive
	}
	if act.port > 0 {
		j, err := act.jupyter(sctx)
		if err != nil {
			act.problem("read Jupyter's activity", err)
		}
		if j != nil {
			cur.Jupyter = j
			if la := j.LastActivity.Truncate(time.Second); la.After(cur.LastActive) && !la.After(now) {
				cur.LastActive = la
			}
			if j.BusyKernels > 0 {
				cur.LastActive = now
			}
		}
	}
	gpus := w.item.Value.GPUs
	if len(gpus) > 0 && cfg.GPUSampler != nil {
		samples, err := sampleSession(sctx, cfg.GPUSampler, w.id, gpus, w.item.Value.Share != nil)
		if err != nil {
			act.problem("sample GPUs", err)
		}
		for _, uuid := range gpus {
			s, ok := samples[uuid]
			if !ok {
				continue
			}
			g := state.GPUActivity{UUID: uuid, UtilizationPercent: s.UtilizationPercent, MemoryUsedMiB: s.MemoryUsedMiB,
				Processes: s.Processes, Simulated: s.Simulated}
			if s.UtilizationPercent >= cfg.GPUBusyPercent {
				cur.LastActive = now
			}
			if s.Processes == 0 && s.UtilizationPercent == 0 {
				since, ok := act.idleSince[uuid]
				if !ok {
					since = now
					act.idleSince[uuid] = since
				}
				g.IdleSince = &since
				g.Unused = now.Sub(since) >= cfg.GPUUnusedAfter
			} else {
				delete(act.idleSince, uuid)
			}
			cur.GPUs = append(cur.GPUs, g)
		}
	}
	w.a.setActivity(w.item.Value.Session, cur.GPUs)
	report := act.goodput(now, &cur)
	if !activityChanged(act.last, &cur, cfg.GPUBusyPercent) && !report {
		return
	}
	if w.setPart(ctx, state.EventObserve, func(st *state.PartStatus) { st.Activity = &cur }) {
		w.a.activityWrites.Add(1)
		act.last = &cur
		if report {
			act.goodputAt = now
		}
	}
}

// goodput reads an elastic job's report into cur (goodput.go), and
// reports whether it alone is worth a write: it changed meaningfully and
// goodputWriteSamples sampling intervals passed since the last write it
// caused. A report not worth writing leaves the one last written in cur.
func (act *activity) goodput(now time.Time, cur *state.Activity) bool {
	if act.reports == "" {
		return false
	}
	r, err := readGoodput(act.reports, act.size)
	switch {
	case err == nil:
		cur.Goodput = &state.GoodputSample{GoodputReport: r, At: now}
	case !errors.Is(err, errNoReport):
		act.problem("read goodput report", err)
		cur.GoodputError = err.Error()
	}
	var last *state.GoodputSample
	lastErr := ""
	if act.last != nil {
		last, lastErr = act.last.Goodput, act.last.GoodputError
	}
	changed := goodputChanged(last, cur.Goodput) || cur.GoodputError != lastErr
	if !changed || now.Sub(act.goodputAt) < goodputWriteSamples*act.w.a.cfg.ActivityEvery {
		cur.Goodput, cur.GoodputError = last, lastErr
		return false
	}
	return true
}

// seed reads the status once: the start that activity counts from, and
// what a previous agent wrote of this run (an adopted container), so that
// idle times survive an agent restart.
func (act *activity) seed(ctx context.Context) bool {
	st, _, err := act.w.currentPart(ctx)
	if err != nil {
		act.problem("read status", err)
		return false
	}
	act.seeded = true
	act.started = time.Now().UTC().Truncate(time.Second)
	if !act.w.started.IsZero() {
		// Started by this worker, maybe not reported Running yet
		// (Config.RunReportAfter): its start is the one it will report.
		act.started = act.w.started.Truncate(time.Second)
	}
	if st.Started != nil {
		act.started = st.Started.UTC().Truncate(time.Second)
	}
	if a := st.Activity; a != nil && !a.Sampled.Before(act.started) {
		act.last = a
		for _, g := range a.GPUs {
			if g.IdleSince != nil {
				act.idleSince[g.UUID] = *g.IdleSince
			}
		}
	}
	return true
}

// problem logs a failure to sample: a warning the first time, then at
// debug level, so a session whose Jupyter never answers does not flood
// the log every interval.
func (act *activity) problem(what string, err error) {
	if act.w.ctx.Err() != nil {
		return
	}
	if !act.warned {
		act.warned = true
		act.w.log.Warn(what+"; further failures are logged at debug level", "err", err)
		return
	}
	act.w.log.Debug(what, "err", err)
}

// jupyterStatus is what Jupyter's /api/status says.
type jupyterStatus struct {
	LastActivity time.Time `json:"last_activity"`
	Connections  int       `json:"connections"`
	Kernels      int       `json:"kernels"`
}

// jupyterKernel is one entry of Jupyter's /api/kernels.
type jupyterKernel struct {
	ExecutionState string `json:"execution_state"`
	Connections    int    `json:"connections"`
}

// jupyter asks the session's Jupyter server for its activity: /api/status
// and /api/kernels, each base URL and token in turn until one answers.
// no_track_activity keeps the agent's own requests from counting as the
// user's activity.
func (act *activity) jupyter(ctx context.Context) (*state.JupyterActivity, error) {
	var st jupyterStatus
	var lastErr error
	found := false
	for bi := range act.bases {
		for ti := range act.tokens {
			// Start from the pair that answered last.
			b, t := (act.good[0]+bi)%len(act.bases), (act.good[1]+ti)%len(act.tokens)
			code, err := act.getJSON(ctx, act.bases[b]+"api/status?no_track_activity=1", act.tokens[t], &st)
			if err != nil {
				return nil, err // no server, or a broken answer: no other pair helps
			}
			switch {
			case code == http.StatusOK:
				act.good, found = [2]int{b, t}, true
			case code == http.StatusNotFound:
				lastErr = fmt.Errorf("GET %sapi/status: 404 (not under this base URL)", act.bases[b])
			default:
				lastErr = fmt.Errorf("GET %sapi/status: %d (token refused?)", act.bases[b], code)
			}
			if found || code == http.StatusNotFound {
				break
			}
		}
		if found {
			break
		}
	}
	if !found {
		return nil, lastErr
	}
	j := &state.JupyterActivity{LastActivity: st.LastActivity.UTC(), Kernels: st.Kernels, Connections: st.Connections}
	var ks []jupyterKernel
	code, err := act.getJSON(ctx, act.bases[act.good[0]]+"api/kernels?no_track_activity=1", act.tokens[act.good[1]], &ks)
	if err != nil || code != http.StatusOK {
		return j, fmt.Errorf("GET %sapi/kernels: %d %v", act.bases[act.good[0]], code, err)
	}
	j.Kernels = len(ks)
	for _, k := range ks {
		if k.ExecutionState == "busy" {
			j.BusyKernels++
		}
	}
	return j, nil
}

// getJSON GETs path on the session's Jupyter port and decodes a 200
// answer into v. It returns the HTTP status; an error only when there was
// no usable answer.
func (act *activity) getJSON(ctx context.Context, path, token string, v any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(act.w.a.cfg.ProbeHost, strconv.Itoa(act.port))+path, nil)
	if err != nil {
		return 0, fmt.Errorf("build Jupyter request: %w", err)
	}
	if token != "" {
		req.Header.Set("Authorization", "token "+token)
	}
	resp, err := act.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("ask Jupyter: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil
	}
	dec := json.NewDecoder(io.LimitReader(resp.Body, jupyterBodyMaxLen))
	if err := dec.Decode(v); err != nil {
		return resp.StatusCode, fmt.Errorf("decode Jupyter's %s: %w", path, err)
	}
	return resp.StatusCode, nil
}

// activityChanged reports whether cur differs meaningfully from prev, the
// activity last written: LastActive moved; Jupyter appeared or went, or
// its kernels or busy kernels changed; a GPU came or went, changed its
// processes, busy (≥ busyPercent), idle or unused flag, its utilisation
// by 10 points or its memory in use by 10% of what was written. Sampled alone, and Jupyter's
// connections, never are.
func activityChanged(prev, cur *state.Activity, busyPercent int) bool {
	if prev == nil {
		return cur != nil
	}
	if !cur.LastActive.Equal(prev.LastActive) || (prev.Jupyter == nil) != (cur.Jupyter == nil) || len(prev.GPUs) != len(cur.GPUs) {
		return true
	}
	if p, c := prev.Jupyter, cur.Jupyter; p != nil && (p.Kernels != c.Kernels || p.BusyKernels != c.BusyKernels) {
		return true
	}
	for i, p := range prev.GPUs {
		c := cur.GPUs[i]
		switch {
		case p.UUID != c.UUID, p.Processes != c.Processes, p.Unused != c.Unused, p.Simulated != c.Simulated,
			(p.IdleSince == nil) != (c.IdleSince == nil),
			(p.UtilizationPercent >= busyPercent) != (c.UtilizationPercent >= busyPercent),
			abs(p.UtilizationPercent-c.UtilizationPercent) >= utilChangePoints,
			p.MemoryUsedMiB != c.MemoryUsedMiB && abs64(p.MemoryUsedMiB-c.MemoryUsedMiB)*100 >= memChangePercent*p.MemoryUsedMiB:
			return true
		}
	}
	return false
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

func abs64(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// setActivity keeps session's latest GPU sample for /metrics.
func (a *Agent) setActivity(session string, gpus []state.GPUActivity) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(gpus) == 0 {
		delete(a.gpuActivity, session)
		return
	}
	a.gpuActivity[session] = gpus
}

// forgetActivity drops session's sample when its worker ends.
func (a *Agent) forgetActivity(session string) { a.setActivity(session, nil) }
