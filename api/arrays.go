package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
)

// ArrayRequest is the body of POST /api/v1/arrays: a batch session
// request used as the template of every element, and which elements.
type ArrayRequest struct {
	SessionRequest
	// Indices is the index set: "0-99", "0-99:10" (every 10th), "1,5,7-9".
	// Exactly one of Indices and Params.
	Indices string `json:"indices,omitempty"`
	// Params are one value per element (a parameter file's lines): element
	// i gets Params[i] as {param} and VOYAGER_ARRAY_PARAM.
	Params []string `json:"params,omitempty"`
	// MaxRunning caps how many elements are unfinished at once; 0: no cap.
	MaxRunning int `json:"maxRunning,omitempty"`
}

// ArrayView is a job array as the API shows it.
type ArrayView struct {
	ID         string           `json:"id"`
	Owner      string           `json:"owner"`
	Template   state.Session    `json:"template"`
	Indices    string           `json:"indices"`
	Params     []string         `json:"params,omitempty"`
	MaxRunning int              `json:"maxRunning"`
	Created    time.Time        `json:"created"`
	Stop       *state.ArrayStop `json:"stop,omitempty"`
	Finished   *time.Time       `json:"finished,omitempty"`
	// Summary counts the elements by where they are.
	Summary state.ArraySummary `json:"summary"`
	// Elements are the created elements in index order (GET of one array
	// only).
	Elements []ArrayElement `json:"elements,omitempty"`
}

// ArrayElement is one created element of an array.
type ArrayElement struct {
	Index    int         `json:"index"`
	Session  string      `json:"session"`
	Phase    state.Phase `json:"phase"`
	Reason   string      `json:"reason,omitempty"`
	ExitCode *int        `json:"exitCode,omitempty"`
	Attempt  int         `json:"attempt,omitempty"`
	Nodes    []string    `json:"nodes,omitempty"`
	Started  *time.Time  `json:"started,omitempty"`
	Finished *time.Time  `json:"finished,omitempty"`
}

// ArrayList is GET /api/v1/arrays.
type ArrayList struct {
	Items []ArrayView `json:"items"`
}

// ArrayStopResult is the answer to POST /api/v1/arrays/{id}/stop.
type ArrayStopResult struct {
	// Stopping counts the elements asked to stop now; the array controller
	// stops any the API did not reach.
	Stopping int       `json:"stopping"`
	Array    ArrayView `json:"array"`
}

// maxParamsBytes bounds an array's parameters in all, so that its record
// stays well inside one etcd request.
const maxParamsBytes = 256 << 10

func (a *API) createArray(c *gin.Context) {
	p := principalOf(c)
	now := a.cfg.Now().UTC()
	idem, ok := a.idempotent(c, now)
	if !ok {
		return
	}
	if a.replayed(c, idem, a.replayArray) {
		return
	}
	var req ArrayRequest
	if !a.decodeBody(c, &req) {
		return
	}
	if req.Kind == "" {
		req.Kind = state.KindBatch
	}
	var errs []FieldError
	add := func(field, format string, args ...any) {
		errs = append(errs, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
	}
	if req.Kind != state.KindBatch {
		add("kind", "got %q; an array's elements are batch sessions: want \"batch\" or leave it out", req.Kind)
	}
	var ix []int
	switch {
	case req.Indices != "" && req.Params != nil:
		add("params", "give indices or params, not both")
	case req.Params != nil:
		n := 0
		for i, v := range req.Params {
			n += len(v)
			if strings.IndexByte(v, 0) >= 0 {
				add(fmt.Sprintf("params[%d]", i), "holds a NUL byte, which no argument or environment variable can carry")
			}
		}
		switch {
		case len(req.Params) == 0:
			add("params", "empty; want one value per element")
		case len(req.Params) > state.MaxArrayElements:
			add("params", "has %d values, want at most %d; split the sweep", len(req.Params), state.MaxArrayElements)
		case n > maxParamsBytes:
			add("params", "holds %d bytes, want at most %d; pass a path per element instead", n, maxParamsBytes)
		default:
			req.Indices = "0-" + strconv.Itoa(len(req.Params)-1)
		}
	case req.Indices == "":
		add("indices", "missing; want an index set such as \"0-99\", or params")
	}
	if req.Indices != "" && len(errs) == 0 {
		var err error
		if ix, err = state.ParseIndexSet(req.Indices); err != nil {
			add("indices", "%v", err)
		}
	}
	if req.MaxRunning < 0 {
		add("maxRunning", "got %d, want 0 (no cap) or more", req.MaxRunning)
	}
	if req.Params == nil && usesParam(req.SessionRequest) {
		add("command", "uses %s, but the array has no params; give params, or use %s", state.PlaceholderParam, state.PlaceholderIndex)
	}
	if len(errs) > 0 {
		a.invalid(c, "Invalid request", errs)
		return
	}
	tmpl, guards, ok := a.admit(c, req.SessionRequest, now)
	if !ok {
		return
	}
	limit := req.MaxRunning
	if limit == 0 || limit > len(ix) {
		limit = len(ix)
	}
	id, err := state.NewSessionID(now)
	if err != nil {
		a.internal(c, "make array id", err)
		return
	}
	arr := state.Array{ID: id, Owner: p.Subject, Groups: p.Groups, Template: tmpl, Indices: req.Indices, Params: req.Params,
		MaxRunning: limit, Created: now}
	// Every element is checked now, as its create would be, so that none
	// fails later for what its substitution made of the template.
	for pos := range ix {
		el := arr.Element(ix, pos, now)
		for _, fe := range append(admissionHoles(el, a.cfg.AllowedRegistries), envLimits(el)...) {
			errs = append(errs, FieldError{Field: fmt.Sprintf("element %d: %s", ix[pos], fe.Field), Message: fe.Message})
		}
		if len(errs) >= 10 {
			break
		}
	}
	if len(errs) > 0 {
		a.invalid(c, "Invalid request", errs)
		return
	}
	ctx := c.Request.Context()
	if errs := a.queued.check(p.Subject, a.cfg.MaxQueuedPerUser, limit, now); len(errs) > 0 {
		a.invalid(c, "Too many queued sessions", errs)
		return
	}
	uid, err := state.EnsureUID(ctx, a.cli, a.keys, p.Subject, now)
	if err != nil {
		a.internal(c, "create array", err)
		return
	}
	arr.Template.UID = &uid
	arr.Template.Owner, arr.Template.Groups, arr.Template.Created = p.Subject, p.Groups, now
	// The elements mount the volumes as admit resolved them: the array is
	// made only if their definitions (and the profile's) are unchanged,
	// as a session's create.
	if idem == nil {
		if err := state.CreateArray(ctx, a.cli, a.keys, arr, guards...); err != nil {
			a.createFailed(c, err)
			return
		}
	} else {
		idem.Record.Array = id
		if !a.withLease(c, idem) {
			return
		}
		stored, created, err := state.CreateArrayIdempotent(ctx, a.cli, a.keys, arr, *idem, guards...)
		if err != nil {
			a.createFailed(c, err)
			return
		}
		if !created {
			a.replayArray(c, idem.Record, stored)
			return
		}
	}
	a.log.Info("array created", "array", id, "owner", p.Subject, "elements", len(ix), "maxRunning", limit, "gpus", tmpl.Resources.GPUs, "service", p.Service)
	c.Header("Location", "/api/v1/arrays/"+id)
	c.JSON(http.StatusCreated, viewArray(arr, len(ix), nil, false))
}

// replayArray answers a repeat of an array's create (replay).
func (a *API) replayArray(c *gin.Context, rec, stored state.IdempotencyRecord) {
	var arr state.Array
	var live map[int]state.Status
	a.replay(c, rec, stored, "array", stored.Array, func() (found bool, err error) {
		arr, _, live, found, err = a.readArray(c.Request.Context(), stored.Array)
		return found, err
	}, func() {
		size, _ := arr.Size()
		c.Header("Idempotent-Replayed", "true")
		c.Header("Location", "/api/v1/arrays/"+arr.ID)
		c.JSON(http.StatusCreated, viewArray(arr, size, live, false))
	})
}

// usesParam reports whether a request's command or environment names
// {param}.
func usesParam(r SessionRequest) bool {
	for _, c := range r.Command {
		if strings.Contains(c, state.PlaceholderParam) {
			return true
		}
	}
	for _, v := range r.Env {
		if strings.Contains(v, state.PlaceholderParam) {
			return true
		}
	}
	return false
}

// envLimits checks what substitution may have grown: argument and
// environment value sizes.
func envLimits(s state.Session) []FieldError {
	var errs []FieldError
	for _, k := range sortedKeys(s.Env) {
		if len(s.Env[k]) > maxEnvValue {
			errs = append(errs, FieldError{Field: "env." + k, Message: fmt.Sprintf("is %d bytes after substitution, want at most %d", len(s.Env[k]), maxEnvValue)})
		}
	}
	for i, c := range s.Command {
		if len(c) > maxEnvValue {
			errs = append(errs, FieldError{Field: fmt.Sprintf("command[%d]", i), Message: fmt.Sprintf("is %d bytes after substitution, want at most %d", len(c), maxEnvValue)})
		}
	}
	return errs
}

// readArray reads array id and its elements' statuses at one revision.
func (a *API) readArray(ctx context.Context, id string) (state.Array, int64, map[int]state.Status, bool, error) {
	resp, err := a.cli.Txn(ctx).Then(
		clientv3.OpGet(a.keys.Array(id)),
		clientv3.OpGet(a.keys.Status(id+"-"), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return state.Array{}, 0, nil, false, fmt.Errorf("read array %s: %w", id, err)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return state.Array{}, 0, nil, false, nil
	}
	arr, err := state.Decode[state.Array](kvs[0].Value)
	if err != nil {
		return state.Array{}, 0, nil, false, fmt.Errorf("read array %s: %w", id, err)
	}
	live := map[int]state.Status{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		sid, _ := a.keys.SessionID(string(kv.Key))
		n, ok := state.ElementIndex(id, sid)
		if !ok {
			continue
		}
		if _, done := arr.Done[strconv.Itoa(n)]; done {
			continue
		}
		if st, err := state.Decode[state.Status](kv.Value); err == nil {
			live[n] = st
		}
	}
	return arr, kvs[0].ModRevision, live, true, nil
}

// viewArray is arr's view: its summary from its record and live, the
// statuses of its unfinished elements, and with elements every created
// element.
func viewArray(arr state.Array, size int, live map[int]state.Status, elements bool) ArrayView {
	v := ArrayView{ID: arr.ID, Owner: arr.Owner, Template: arr.Template, Indices: arr.Indices, Params: arr.Params,
		MaxRunning: arr.MaxRunning, Created: arr.Created, Stop: arr.Stop, Finished: arr.Finished,
		Summary: state.Summarize(arr, size, live)}
	if !elements {
		return v
	}
	for idx, r := range arr.Done {
		n, err := strconv.Atoi(idx)
		if err != nil {
			continue
		}
		v.Elements = append(v.Elements, ArrayElement{Index: n, Session: state.ElementID(arr.ID, n), Phase: r.Phase, Reason: r.Reason,
			ExitCode: r.ExitCode, Attempt: r.Attempt})
	}
	for n, st := range live {
		v.Elements = append(v.Elements, ArrayElement{Index: n, Session: state.ElementID(arr.ID, n), Phase: st.Phase, Reason: st.Reason,
			ExitCode: st.ExitCode, Attempt: st.Attempt, Nodes: st.Nodes, Started: st.Started, Finished: st.Finished})
	}
	sort.Slice(v.Elements, func(i, j int) bool { return v.Elements[i].Index < v.Elements[j].Index })
	return v
}

// loadArray reads array :id for its owner or an admin, answering 404
// otherwise.
func (a *API) loadArray(c *gin.Context) (state.Array, int64, map[int]state.Status, bool) {
	id := c.Param("id")
	if state.ValidateName("array id", id) != nil {
		a.problem(c, http.StatusNotFound, "Not found", fmt.Sprintf("no array %q", truncate(id, 64)))
		return state.Array{}, 0, nil, false
	}
	arr, rev, live, found, err := a.readArray(c.Request.Context(), id)
	if err != nil {
		a.internal(c, "read array", err)
		return state.Array{}, 0, nil, false
	}
	if !found || !visible(principalOf(c), arr.Owner) {
		a.problem(c, http.StatusNotFound, "Not found", fmt.Sprintf("no array %q", id))
		return state.Array{}, 0, nil, false
	}
	return arr, rev, live, true
}

func (a *API) getArray(c *gin.Context) {
	arr, _, live, ok := a.loadArray(c)
	if !ok {
		return
	}
	size, _ := arr.Size()
	c.JSON(http.StatusOK, viewArray(arr, size, live, true))
}

func (a *API) listArrays(c *gin.Context) {
	p := principalOf(c)
	ctx := c.Request.Context()
	resp, err := a.cli.Get(ctx, a.keys.Arrays(), clientv3.WithPrefix())
	if err != nil {
		a.internal(c, "list arrays", err)
		return
	}
	out := ArrayList{Items: []ArrayView{}}
	for _, kv := range resp.Kvs {
		arr, err := state.Decode[state.Array](kv.Value)
		if err != nil || !visible(p, arr.Owner) {
			continue
		}
		live := map[int]state.Status{}
		if arr.Finished == nil {
			var found bool
			arr, _, live, found, err = a.readArray(ctx, arr.ID)
			if err != nil {
				a.internal(c, "list arrays", err)
				return
			}
			if !found {
				continue
			}
		}
		size, _ := arr.Size()
		out.Items = append(out.Items, viewArray(arr, size, live, false))
	}
	c.JSON(http.StatusOK, out)
}

// maxArrayStopAttempts bounds stopArray's read-modify-write rounds against
// the array controller's writes.
const maxArrayStopAttempts = 16

func (a *API) stopArray(c *gin.Context) {
	arr, rev, _, ok := a.loadArray(c)
	if !ok {
		return
	}
	ctx := c.Request.Context()
	p := principalOf(c)
	by := p.Subject
	if p.Service != "" {
		by += " via " + p.Service
	}
	now := a.cfg.Now().UTC()
	var err error
	for attempt := 0; ; attempt++ {
		var stopped state.Array
		stopped, err = state.StopArray(ctx, a.cli, a.keys, arr, rev, by, now)
		if err == nil {
			arr = stopped
			break
		}
		if !errors.Is(err, state.ErrConflict) || attempt == maxArrayStopAttempts {
			a.internal(c, "stop array", err)
			return
		}
		var found bool
		if arr, rev, _, found, err = a.readArray(ctx, arr.ID); err != nil || !found {
			a.internal(c, "stop array", fmt.Errorf("read array: %w", errors.Join(err, state.ErrNotFound)))
			return
		}
	}
	// No element is created after the stop: the controller's creates
	// compare the revision the stop changed. Stop the ones that exist;
	// the controller repeats this for any a failure here leaves.
	ix, _ := state.ParseIndexSet(arr.Indices)
	stopping := 0
	for pos := 0; pos < arr.Next && pos < len(ix); pos++ {
		if _, done := arr.Done[strconv.Itoa(ix[pos])]; done {
			continue
		}
		out, err := state.StopSession(ctx, a.cli, a.keys, state.ElementID(arr.ID, ix[pos]), "the stop of array "+arr.ID+" by "+by, now)
		if err != nil && !errors.Is(err, state.ErrNotFound) {
			a.log.Warn("stop array element", "array", arr.ID, "index", ix[pos], "err", err)
			continue
		}
		if out != state.StopAlready {
			stopping++
		}
	}
	a.log.Info("array stop", "array", arr.ID, "by", by, "stopping", stopping)
	arr, _, live, _, err := a.readArray(ctx, arr.ID)
	if err != nil {
		a.internal(c, "read array", err)
		return
	}
	c.JSON(http.StatusAccepted, ArrayStopResult{Stopping: stopping, Array: viewArray(arr, len(ix), live, true)})
}
