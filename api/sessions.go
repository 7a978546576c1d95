package api

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
)

// SessionView is a session as the API shows it: the spec, its status
// (with the agent's activity samples while it runs), the lifecycle
// controller's warning if it will stop the session, and when its max
// runtime ends.
type SessionView struct {
	state.Session
	Status state.Status `json:"status"`
	// Warning, when set, says that the system will stop the session, why
	// and when (warnings/<id>): idle, max runtime, a drained node or
	// preemption. It goes away when its cause does.
	Warning *state.Warning `json:"warning,omitempty"`
	// RunsUntil is when the session's max runtime ends: its start plus its
	// limit (limits.maxRuntime, else the cluster default). Absent while it
	// has not started, and when it has no limit.
	RunsUntil *time.Time `json:"runsUntil,omitempty"`
	// Estimate is, while the session waits in the queue, when it could
	// start (as GET /queue estimates the caller's own): JupyterHub's
	// pending page shows it.
	Estimate *QueueEstimate `json:"estimate,omitempty"`
}

// SessionList is one page of GET /api/v1/sessions.
type SessionList struct {
	Items []SessionView `json:"items"`
	// Continue, when not empty, fetches the next page (?continue=…).
	Continue string `json:"continue,omitempty"`
}

// StopResult is the answer to a stop or delete.
type StopResult struct {
	// Outcome is "cancelled" (it was pending: now Stopped), "stopping"
	// (its agent will stop it) or "unchanged" (it had already ended or
	// been asked to stop).
	Outcome state.StopOutcome `json:"outcome"`
	Session SessionView       `json:"session"`
}

func (a *API) createSession(c *gin.Context) {
	p := principalOf(c)
	now := a.cfg.Now().UTC()
	idem, ok := a.idempotent(c, now)
	if !ok || a.replayed(c, idem, a.replaySession) {
		return
	}
	var req SessionRequest
	if !a.decodeBody(c, &req) {
		return
	}
	ctx := c.Request.Context()
	s, guards, ok := a.admit(c, req, now)
	if !ok {
		return
	}
	id, err := state.NewSessionID(now)
	if err != nil {
		a.internal(c, "make session id", err)
		return
	}
	if errs := a.queued.admit(p.Subject, id, a.cfg.MaxQueuedPerUser, now); len(errs) > 0 {
		a.invalid(c, "Too many queued sessions", errs)
		return
	}
	created := false
	defer func() {
		if !created {
			a.queued.release(id)
		}
	}()
	s.ID, s.Owner, s.Groups, s.Created = id, p.Subject, p.Groups, now
	uid, err := state.EnsureUID(ctx, a.cli, a.keys, p.Subject, now)
	if err != nil {
		a.internal(c, "create session", err)
		return
	}
	s.UID = &uid

	if idem == nil {
		if _, err := state.CreateSession(ctx, a.cli, a.keys, s, now, guards...); err != nil {
			a.createFailed(c, err)
			return
		}
		created = true
		a.log.Info("session created", "session", id, "owner", s.Owner, "kind", s.Kind, "gpus", s.Resources.GPUs, "service", p.Service)
		a.respondCreated(c, SessionView{Session: s, Status: state.NewStatus(s, now)}, false)
		return
	}
	idem.Record.Session = id
	if !a.withLease(c, idem) {
		return
	}
	var stored state.IdempotencyRecord
	stored, created, err = state.CreateSessionIdempotent(ctx, a.cli, a.keys, s, now, *idem, guards...)
	if err != nil {
		a.createFailed(c, err)
		return
	}
	if created {
		a.log.Info("session created", "session", id, "owner", s.Owner, "kind", s.Kind, "gpus", s.Resources.GPUs, "service", p.Service)
		a.respondCreated(c, SessionView{Session: s, Status: state.NewStatus(s, now)}, false)
		return
	}
	a.replaySession(c, idem.Record, stored)
}

// replaySession answers a repeat of a session's create (replay).
func (a *API) replaySession(c *gin.Context, rec, stored state.IdempotencyRecord) {
	var v SessionView
	a.replay(c, rec, stored, "session", stored.Session, func() (found bool, err error) {
		v, found, err = a.readSession(c.Request.Context(), stored.Session)
		return found, err
	}, func() { a.respondCreated(c, v, true) })
}

// createFailed answers a create whose transaction failed: a profile or
// volume redefined between its read and the write is a conflict to retry.
func (a *API) createFailed(c *gin.Context, err error) {
	if errors.Is(err, state.ErrConflict) {
		a.problem(c, http.StatusConflict, "Conflict", "the profile, a volume or the team the session names was redefined while it was being created; send the request again")
		return
	}
	a.internal(c, "create session", err)
}

// admit builds the session req asks for (with its profile, if it names
// one) and checks it as every create does: the request's fields, the
// caller's groups, what a node would only fail at start, whether any node
// could ever hold it, and the volumes it mounts (its own and its
// profile's), resolved into the spec. It returns the compares that keep
// the create to the profile and volume definitions it was built from. It
// answers the problem and returns false when a check fails.
func (a *API) admit(c *gin.Context, req SessionRequest, now time.Time) (state.Session, []clientv3.Cmp, bool) {
	ctx := c.Request.Context()
	var (
		prof   *state.Profile
		guards []clientv3.Cmp
	)
	if req.Profile != "" {
		if err := state.ValidateName("profile", req.Profile); err != nil {
			a.invalid(c, "Invalid request", []FieldError{{Field: "profile", Message: err.Error()}})
			return state.Session{}, nil, false
		}
		key := a.keys.Profile(req.Profile)
		pv, rev, err := state.Get[state.Profile](ctx, a.cli, key)
		switch {
		case errors.Is(err, state.ErrNotFound):
			a.invalid(c, "Invalid request", []FieldError{{Field: "profile", Message: fmt.Sprintf("no profile %q; GET /api/v1/profiles lists them (%s)", req.Profile, a.profileNames(c))}})
			return state.Session{}, nil, false
		case err != nil:
			a.internal(c, "read profile", err)
			return state.Session{}, nil, false
		}
		prof = &pv
		guards = append(guards, clientv3.Compare(clientv3.ModRevision(key), "=", rev))
	}
	s, vols, errs := buildSession(req, prof, a.admission())
	errs = append(errs, validateGroups(principalOf(c).Groups)...)
	errs = append(errs, admissionHoles(s, a.cfg.AllowedRegistries)...)
	if len(errs) > 0 {
		a.invalid(c, "Invalid request", errs)
		return state.Session{}, nil, false
	}
	if errs := a.feasible(s, now); len(errs) > 0 {
		a.invalid(c, "Unsatisfiable request", errs)
		return state.Session{}, nil, false
	}
	if nodes, _ := a.feasibilityNodes(); s.Elastic != nil {
		if errs := elasticFeasibility(s, nodes, a.cfg.Plan, now); len(errs) > 0 {
			a.invalid(c, "Unsatisfiable request", errs)
			return state.Session{}, nil, false
		}
	}
	// The spec holds the volumes as read: the create commits only if
	// their definitions are unchanged.
	vguards, ok := a.mountVolumes(c, vols, principalOf(c), &s)
	if !ok {
		return state.Session{}, nil, false
	}
	// Its team, and the team's priority ceiling, as read (teams.go).
	tguards, ok := a.admitTeam(c, principalOf(c), req.Team, &s)
	if !ok {
		return state.Session{}, nil, false
	}
	return s, append(append(guards, vguards...), tguards...), true
}

func (a *API) respondCreated(c *gin.Context, v SessionView, replay bool) {
	if replay {
		c.Header("Idempotent-Replayed", "true")
	}
	c.Header("Location", "/api/v1/sessions/"+v.ID)
	c.JSON(http.StatusCreated, a.present(c, v))
}

// readSession reads a session's spec, status and warning in one round
// trip, so the three agree.
func (a *API) readSession(ctx context.Context, id string) (SessionView, bool, error) {
	v, _, found, err := a.readSessionRev(ctx, id)
	return v, found, err
}

// readSessionRev is readSession that also returns the spec's mod revision,
// for a write conditional on it.
func (a *API) readSessionRev(ctx context.Context, id string) (SessionView, int64, bool, error) {
	resp, err := a.cli.Txn(ctx).Then(clientv3.OpGet(a.keys.Session(id)), clientv3.OpGet(a.keys.Status(id)), clientv3.OpGet(a.keys.Warning(id))).Commit()
	if err != nil {
		return SessionView{}, 0, false, fmt.Errorf("read session %s: %w", id, err)
	}
	return a.decodeSession(id, resp)
}

// readSessionServing is readSession for GET /sessions/{id}, the request
// that clients poll. It reads serializably: the etcd member the client
// reaches answers from what it has applied, without first waiting until
// it has applied everything committed (a linearizable read waits for the
// writes in flight, an fsync on a busy etcd, and that wait was most of a
// GET's p99). It reads again linearizably when the session is not there
// (one just created through a member that has not applied it yet) or
// when the member answered from a revision older than this API's watch
// caches had reached when the request came (a member behind the cluster).
// So a GET is never older than what this API had seen when it came, and
// with one etcd member it shows every write acknowledged before it.
func (a *API) readSessionServing(ctx context.Context, id string) (SessionView, bool, error) {
	// Read before the request: the watches move on while it is in flight.
	seen := a.seenRevision()
	resp, err := a.cli.Txn(ctx).Then(clientv3.OpGet(a.keys.Session(id), clientv3.WithSerializable()),
		clientv3.OpGet(a.keys.Status(id), clientv3.WithSerializable()), clientv3.OpGet(a.keys.Warning(id), clientv3.WithSerializable())).Commit()
	if err != nil {
		return SessionView{}, false, fmt.Errorf("read session %s: %w", id, err)
	}
	if len(resp.Responses[0].GetResponseRange().Kvs) == 0 || resp.Header.Revision < seen {
		a.metrics.servingRereads.Inc()
		v, _, found, err := a.readSessionRev(ctx, id)
		return v, found, err
	}
	v, _, found, err := a.decodeSession(id, resp)
	return v, found, err
}

// seenRevision is the newest revision this API's watch caches have
// reached: the sessions' specs (runtimes), statuses, warnings, secrets
// and the queue among them.
func (a *API) seenRevision() int64 {
	return max(a.runtimes.Revision(), a.status.Revision(), a.warns.Revision(), a.secrets.Revision(),
		a.pending.Revision(), a.nodes.Revision(), a.ledgers.Revision(), a.cordons.Revision(), a.quotas.Revision())
}

// decodeSession reads the view of session id from resp, a transaction
// of three reads: spec, status and warning.
func (a *API) decodeSession(id string, resp *clientv3.TxnResponse) (SessionView, int64, bool, error) {
	specs := resp.Responses[0].GetResponseRange().Kvs
	if len(specs) == 0 {
		return SessionView{}, 0, false, nil
	}
	var v SessionView
	var err error
	if v.Session, err = state.Decode[state.Session](specs[0].Value); err != nil {
		return SessionView{}, 0, false, fmt.Errorf("read session %s: %w", id, err)
	}
	if sts := resp.Responses[1].GetResponseRange().Kvs; len(sts) > 0 {
		if v.Status, err = state.Decode[state.Status](sts[0].Value); err != nil {
			return SessionView{}, 0, false, fmt.Errorf("read session %s: %w", id, err)
		}
	}
	if ws := resp.Responses[2].GetResponseRange().Kvs; len(ws) > 0 {
		// A warning that does not decode is left out rather than failing
		// the read: the spec and status are what the reader needs.
		if w, err := state.Decode[state.Warning](ws[0].Value); err == nil {
			v.Warning = &w
		}
	}
	return v, specs[0].ModRevision, true, nil
}

// effectiveMaxRuntime is the max runtime that applies to s: its own limit,
// else the cluster default; 0 when neither sets one.
func (a *API) effectiveMaxRuntime(s state.Session) time.Duration {
	if s.Limits.MaxRuntime > 0 {
		return s.Limits.MaxRuntime.Std()
	}
	return a.cfg.MaxRuntime
}

// visible reports whether p may see a session of owner: its owner, or an
// admin. Others get 404, never 403, so ids of others' sessions leak nothing.
func visible(p Principal, owner string) bool { return p.Admin || p.Subject == owner }

// loadVisible reads session :id and answers 404 when it does not exist or
// is not the caller's.
func (a *API) loadVisible(c *gin.Context) (SessionView, bool) {
	return a.loadVisibleFrom(c, a.readSession)
}

// loadVisibleFrom is loadVisible reading the session with read.
func (a *API) loadVisibleFrom(c *gin.Context, read func(ctx context.Context, id string) (SessionView, bool, error)) (SessionView, bool) {
	id := c.Param("id")
	if state.ValidateName("session id", id) != nil {
		a.problem(c, http.StatusNotFound, "Not found", fmt.Sprintf("no session %q", truncate(id, 64)))
		return SessionView{}, false
	}
	v, found, err := read(c.Request.Context(), id)
	if err != nil {
		a.internal(c, "read session", err)
		return SessionView{}, false
	}
	if !found || !visible(principalOf(c), v.Owner) {
		a.problem(c, http.StatusNotFound, "Not found", fmt.Sprintf("no session %q", id))
		return SessionView{}, false
	}
	return v, true
}

// present prepares a view for its reader: a live queue position and
// reason for a pending session, the agent's internal URLs removed, and
// the Jupyter token only for the owner.
func (a *API) present(c *gin.Context, v SessionView) SessionView {
	return a.presentAs(principalOf(c), v, true)
}

// presentAs is present for principal p; live adds the live queue view.
func (a *API) presentAs(p Principal, v SessionView, live bool) SessionView {
	if live && v.Status.Phase == state.PhasePending {
		qp := a.queuePlan()
		if i, ok := qp.waiting[v.ID]; ok {
			w := qp.plan.Waiting[i]
			v.Status.QueuePosition, v.Status.Reason, v.Status.Message = w.Position, w.Reason, w.Message
			if w.Pending.Entry != nil {
				v.Estimate = a.newEstimator().estimate(*w.Pending.Entry, w.Position)
			}
		}
	}
	if len(v.Status.URLs) > 0 {
		if p.Subject == v.Owner {
			v.Status.URLs = state.JoinSecrets(v.Status.URLs, a.secretsOf(v.Status))
		}
		urls := make(map[string]string, len(v.Status.URLs))
		for k, u := range v.Status.URLs {
			if k == logsURLKey {
				continue
			}
			if p.Subject != v.Owner {
				u = stripToken(u)
			}
			urls[k] = u
		}
		v.Status.URLs = urls
	}
	if p.Subject != v.Owner {
		v.Env = nil // may hold the owner's secrets
	} else {
		v = a.withEnvSecrets(v)
	}
	if limit := a.effectiveMaxRuntime(v.Session); limit > 0 && v.Status.Started != nil && v.Status.Phase == state.PhaseRunning {
		until := v.Status.Started.Add(limit)
		v.RunsUntil = &until
	}
	return v
}

// secretsOf returns the secrets that the agents of st's nodes published
// (secrets/<node>/<id>): from the cache, else, when the status is newer
// than the cache, read from etcd.
func (a *API) secretsOf(st state.Status) state.Secrets {
	if slices.ContainsFunc(slices.Collect(maps.Values(st.URLs)), state.HasSecretParams) {
		return state.Secrets{} // written before secrets/ existed: complete
	}
	for _, n := range st.Nodes {
		key := a.keys.Secret(n, st.Session)
		if sec, ok := a.secrets.Get(key); ok {
			return sec
		}
		ctx, cancel := context.WithTimeout(a.streams, 2*time.Second)
		sec, _, err := state.Get[state.Secrets](ctx, a.cli, key)
		cancel()
		if err == nil {
			return sec
		}
	}
	return state.Secrets{}
}

// stripToken removes a token query parameter from a URL.
func stripToken(u string) string {
	pu, err := url.Parse(u)
	if err != nil {
		return ""
	}
	q := pu.Query()
	if !q.Has("token") {
		return u
	}
	q.Del("token")
	pu.RawQuery = q.Encode()
	return pu.String()
}

func (a *API) getSession(c *gin.Context) {
	v, ok := a.loadVisibleFrom(c, a.readSessionServing)
	if !ok {
		return
	}
	c.JSON(http.StatusOK, a.present(c, v))
}

// Listing bounds.
const (
	defaultPageSize = 50
	maxPageSize     = 500
	maxScan         = 5000 // keys read per list request at most
)

func (a *API) listSessions(c *gin.Context) {
	p := principalOf(c)
	owner := c.Query("owner")
	if owner != "" && owner != p.Subject && !p.Admin {
		a.problem(c, http.StatusForbidden, "Forbidden", fmt.Sprintf("only admins may list other users' sessions; leave owner out to list yours (%s)", p.Subject))
		return
	}
	if !p.Admin {
		owner = p.Subject
	}
	phase := state.Phase(c.Query("phase"))
	if phase != "" && !knownPhase(phase) {
		a.invalid(c, "Invalid request", []FieldError{{Field: "query phase", Message: fmt.Sprintf("got %q, want one of Pending, Bound, Starting, Running, Succeeded, Failed, Stopping, Stopped, Lost", phase)}})
		return
	}
	limit := defaultPageSize
	if l := c.Query("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > maxPageSize {
			a.invalid(c, "Invalid request", []FieldError{{Field: "query limit", Message: fmt.Sprintf("got %q, want a whole number from 1 to %d", l, maxPageSize)}})
			return
		}
		limit = n
	}
	from := a.keys.Sessions()
	if tok := c.Query("continue"); tok != "" {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || state.ValidateName("session id", string(b)) != nil {
			a.invalid(c, "Invalid request", []FieldError{{Field: "query continue", Message: "not a token from a previous page; leave it out to start from the first page"}})
			return
		}
		from = a.keys.Session(string(b)) + "\x00"
	}
	end := clientv3.GetPrefixRangeEnd(a.keys.Sessions())
	ctx := c.Request.Context()
	out := SessionList{Items: []SessionView{}}
	scanned := 0
	var rev int64
	for scanned < maxScan {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(int64(min(limit*2, 500)))}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := a.cli.Get(ctx, from, opts...)
		if err != nil {
			a.internal(c, "list sessions", err)
			return
		}
		rev = resp.Header.Revision
		if len(resp.Kvs) == 0 {
			c.JSON(http.StatusOK, out)
			return
		}
		ids := make([]string, 0, len(resp.Kvs))
		specs := make([]state.Session, 0, len(resp.Kvs))
		for _, kv := range resp.Kvs {
			s, err := state.Decode[state.Session](kv.Value)
			id, ok := a.keys.SessionID(string(kv.Key))
			if err != nil || !ok {
				continue
			}
			s.ID = id
			ids = append(ids, id)
			specs = append(specs, s)
		}
		statuses := map[string]state.Status{}
		warnings := map[string]*state.Warning{}
		if len(ids) > 0 {
			sresp, err := a.cli.Get(ctx, a.keys.Status(ids[0]), clientv3.WithRange(a.keys.Status(ids[len(ids)-1])+"\x00"), clientv3.WithRev(rev))
			if err != nil {
				a.internal(c, "list sessions", err)
				return
			}
			for _, kv := range sresp.Kvs {
				if st, err := state.Decode[state.Status](kv.Value); err == nil {
					if id, ok := a.keys.SessionID(string(kv.Key)); ok {
						statuses[id] = st
					}
				}
			}
			// Warnings are few: one range read over the page's ids, at the
			// same revision as the specs and statuses.
			wresp, err := a.cli.Get(ctx, a.keys.Warning(ids[0]), clientv3.WithRange(a.keys.Warning(ids[len(ids)-1])+"\x00"), clientv3.WithRev(rev))
			if err != nil {
				a.internal(c, "list sessions", err)
				return
			}
			for _, kv := range wresp.Kvs {
				if w, err := state.Decode[state.Warning](kv.Value); err == nil {
					if id, ok := a.keys.SessionID(string(kv.Key)); ok {
						warnings[id] = &w
					}
				}
			}
		}
		for i, s := range specs {
			scanned++
			if (owner == "" || s.Owner == owner) && (phase == "" || statuses[s.ID].Phase == phase) {
				out.Items = append(out.Items, a.present(c, SessionView{Session: s, Status: statuses[s.ID], Warning: warnings[s.ID]}))
				if len(out.Items) == limit {
					if i < len(specs)-1 || resp.More {
						out.Continue = base64.RawURLEncoding.EncodeToString([]byte(s.ID))
					}
					c.JSON(http.StatusOK, out)
					return
				}
			}
		}
		if !resp.More {
			c.JSON(http.StatusOK, out)
			return
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	// Scanned enough for one request: hand back what was found, and a
	// token to go on from the last key read.
	if last, ok := a.keys.SessionID(strings.TrimSuffix(from, "\x00")); ok {
		out.Continue = base64.RawURLEncoding.EncodeToString([]byte(last))
	}
	c.JSON(http.StatusOK, out)
}

func knownPhase(p state.Phase) bool {
	switch p {
	case state.PhasePending, state.PhaseBound, state.PhaseStarting, state.PhaseRunning, state.PhaseSucceeded,
		state.PhaseFailed, state.PhaseStopping, state.PhaseStopped, state.PhaseLost:
		return true
	}
	return false
}

func (a *API) stopSession(c *gin.Context) {
	v, ok := a.loadVisible(c)
	if !ok {
		return
	}
	p := principalOf(c)
	by := p.Subject
	if p.Service != "" {
		by += " via " + p.Service
	}
	out, err := state.StopSession(c.Request.Context(), a.cli, a.keys, v.ID, by, a.cfg.Now())
	if err != nil {
		if errors.Is(err, state.ErrNotFound) {
			a.problem(c, http.StatusNotFound, "Not found", fmt.Sprintf("no session %q", v.ID))
			return
		}
		a.internal(c, "stop session", err)
		return
	}
	a.log.Info("session stop", "session", v.ID, "by", by, "outcome", out)
	nv, found, err := a.readSession(c.Request.Context(), v.ID)
	if err != nil || !found {
		nv = v
	}
	c.JSON(http.StatusAccepted, StopResult{Outcome: out, Session: a.present(c, nv)})
}

// profileNames lists the profiles for an error message.
func (a *API) profileNames(c *gin.Context) string {
	resp, err := a.cli.Get(c.Request.Context(), a.keys.Profiles(), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(50))
	if err != nil || len(resp.Kvs) == 0 {
		return "there are none"
	}
	var names []string
	for _, kv := range resp.Kvs {
		if n, ok := a.keys.ProfileName(string(kv.Key)); ok {
			names = append(names, n)
		}
	}
	return "there are: " + strings.Join(names, ", ")
}
