package api

import (
	"fmt"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/voyager-gpu/voyager/internal/audit"
)

// auditActions names the routes that change state, for the audit log's
// action field. A write route missing here is still recorded, as
// "METHOD /route".
var auditActions = map[string]string{
	"POST /api/v1/sessions":                 "session.create",
	"POST /api/v1/sessions/:id/stop":        "session.stop",
	"DELETE /api/v1/sessions/:id":           "session.stop",
	"POST /api/v1/sessions/:id/extend":      "session.extend",
	"POST /api/v1/arrays":                   "array.create",
	"POST /api/v1/arrays/:id/stop":          "array.stop",
	"POST /api/v1/nodes/:name/cordon":       "node.cordon",
	"POST /api/v1/nodes/:name/uncordon":     "node.uncordon",
	"POST /api/v1/nodes/:name/drain":        "node.drain",
	"PUT /api/v1/profiles/:name":            "profile.put",
	"DELETE /api/v1/profiles/:name":         "profile.delete",
	"PUT /api/v1/quotas/:scope/:name":       "quota.put",
	"DELETE /api/v1/quotas/:scope/:name":    "quota.delete",
	"PUT /api/v1/volumes/:name":             "volume.put",
	"DELETE /api/v1/volumes/:name":          "volume.delete",
	"* /api/v1/sessions/:id/ray/dashboard/": "session.ray-dashboard",
}

// Keys of the request's gin context that the audit middleware reads.
const (
	auditFieldsKey  = "voyager.audit.fields"
	auditProblemKey = "voyager.audit.problem"
)

// auditField adds key=value to the request's audit record, and records
// the request even when its method does not change state (an exec or a
// port-forward opened with GET). Never pass a secret value.
func auditField(c *gin.Context, key, value string) {
	m, _ := c.Get(auditFieldsKey)
	fields, _ := m.(map[string]string)
	if fields == nil {
		fields = map[string]string{}
		c.Set(auditFieldsKey, fields)
	}
	fields[key] = value
}

// auditCall is the middleware that records every state-changing call
// (every method but GET, HEAD and OPTIONS, and any request a handler
// added fields to) in the audit log once it has been answered, whatever
// its outcome: refused before authentication, invalid, forbidden, done.
func (a *API) auditCall(c *gin.Context) {
	if a.cfg.Audit == nil {
		c.Next()
		return
	}
	start := a.cfg.Now()
	c.Next()
	_, marked := c.Get(auditFieldsKey)
	switch c.Request.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		if !marked {
			return
		}
	}
	a.writeAudit(c, start)
}

// writeAudit writes the audit record of the request c, received at start.
func (a *API) writeAudit(c *gin.Context, start time.Time) {
	route := c.FullPath()
	action, ok := auditActions[c.Request.Method+" "+route]
	if !ok && strings.HasPrefix(route, "/api/v1/sessions/:id/ray/dashboard/") {
		action = auditActions["* /api/v1/sessions/:id/ray/dashboard/"]
	} else if !ok {
		if route == "" {
			route = c.Request.URL.Path
		}
		action = c.Request.Method + " " + route
	}
	status := c.Writer.Status()
	r := audit.Record{
		Time:       start,
		Action:     action,
		Method:     c.Request.Method,
		Path:       c.Request.URL.Path,
		Target:     auditTarget(c),
		Outcome:    audit.OutcomeOf(status),
		Status:     status,
		Remote:     c.ClientIP(),
		DurationMS: float64(a.cfg.Now().Sub(start).Microseconds()) / 1000,
	}
	if p, ok := c.Get(principalKey); ok {
		pr, _ := p.(Principal)
		r.Actor, r.Admin = pr.Subject, pr.Admin
		if pr.Service != "" {
			r.Actor, r.OnBehalfOf = pr.Service, pr.Subject
		}
	}
	if d, ok := c.Get(auditProblemKey); ok {
		r.Detail = truncate(fmt.Sprint(d), 512)
	}
	if m, ok := c.Get(auditFieldsKey); ok {
		r.Fields, _ = m.(map[string]string)
	}
	if err := a.cfg.Audit.Write(r); err != nil {
		a.log.Error("audit record not written", "err", err, "action", r.Action, "actor", r.Actor, "target", r.Target, "outcome", r.Outcome)
	}
}

// auditTarget is the object a call acts on: its path's id or name (a
// quota's scope/name), else what it created (its Location).
func auditTarget(c *gin.Context) string {
	if scope := c.Param("scope"); scope != "" {
		return scope + "/" + c.Param("name")
	}
	for _, p := range []string{"id", "name"} {
		if v := c.Param(p); v != "" {
			return v
		}
	}
	if loc := c.Writer.Header().Get("Location"); loc != "" {
		return path.Base(loc)
	}
	return ""
}

// AuditList is GET /api/v1/audit: the records that match, oldest first.
type AuditList struct {
	Items []audit.Record `json:"items"`
	// More is true when older records matched too: ask again with an
	// earlier until, or a larger limit.
	More bool `json:"more"`
}

// maxAuditLimit caps one read of the audit log.
const maxAuditLimit = 10000

// listAudit is GET /api/v1/audit (admins): the newest records of this
// API process's log that match since, until, actor, action, target and
// outcome.
func (a *API) listAudit(c *gin.Context) {
	if a.cfg.Audit == nil {
		a.problem(c, http.StatusNotFound, "Not found", "this API process keeps no audit log (VOYAGER_API_AUDIT_LOG is off)")
		return
	}
	var errs []FieldError
	now := a.cfg.Now()
	f := audit.Filter{Actor: c.Query("actor"), Action: c.Query("action"), Target: c.Query("target"), Outcome: c.Query("outcome"), Limit: 1000}
	for _, q := range []struct {
		name string
		to   *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		t, err := parseWhen(c.Query(q.name), now)
		if err != nil {
			errs = append(errs, FieldError{Field: q.name, Message: err.Error()})
		}
		*q.to = t
	}
	switch f.Outcome {
	case "", audit.OK, audit.Refused, audit.Failed:
	default:
		errs = append(errs, FieldError{Field: "outcome", Message: fmt.Sprintf("got %q, want ok, refused or failed", truncate(f.Outcome, 40))})
	}
	if s := c.Query("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxAuditLimit {
			errs = append(errs, FieldError{Field: "limit", Message: fmt.Sprintf("got %q, want a whole number from 1 to %d", truncate(s, 40), maxAuditLimit)})
		}
		f.Limit = n
	}
	if len(errs) > 0 {
		a.invalid(c, "Invalid query", errs)
		return
	}
	items, more, err := a.cfg.Audit.Read(f)
	if err != nil {
		a.log.Error("read audit log", "err", err)
		a.problem(c, http.StatusInternalServerError, "Internal error", "read the audit log: "+err.Error())
		return
	}
	c.JSON(http.StatusOK, AuditList{Items: items, More: more})
}

// parseWhen reads a time as RFC 3339 or as a duration before now ("1h");
// "" is the zero time.
func parseWhen(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("got %q, want an RFC 3339 time (2026-01-02T15:04:05Z) or a duration before now (90m, 24h)", truncate(s, 40))
}
