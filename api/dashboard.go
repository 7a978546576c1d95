package api

import (
	"fmt"
	"net/http"
	"net/http/httputil"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/voyager-gpu/voyager/state"
)

// dashboardCSP is the Content-Security-Policy of every proxied dashboard
// response: the page runs in an opaque origin, so that a tenant's
// dashboard (the session's own code serves it) read through the API's
// origin can read none of that origin's storage, such as the web
// console's token.
const dashboardCSP = "sandbox allow-scripts allow-forms allow-popups allow-downloads"

// dashboardMethods are the methods the dashboard proxy passes: its pages
// and Ray's Jobs API (submit, stop, delete).
var dashboardMethods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete}

// rayDashboard is GET, POST, PUT or DELETE /api/v1/sessions/:id/ray/dashboard/*path: the Ray
// dashboard of the caller's own running Ray session, proxied through the
// agent of its head (state.AgentDashboardPath), which connects to the
// dashboard inside the head's container: the dashboard is never published.
// Only the owner (or a service acting for them) passes: the dashboard runs
// jobs as the session, so not even an admin reaches another user's. The
// caller's Authorization and Cookie headers never leave the API.
func (a *API) rayDashboard(c *gin.Context) {
	v, ok := a.loadVisible(c)
	if !ok {
		return
	}
	if principalOf(c).Subject != v.Owner {
		a.problem(c, http.StatusForbidden, "Forbidden", fmt.Sprintf("the Ray dashboard of session %s runs code as its owner %s: only they reach it", v.ID, v.Owner))
		return
	}
	if v.Ray == nil {
		a.problem(c, http.StatusNotFound, "Not found", fmt.Sprintf("session %s has no Ray cluster (ask for one with ray.workers)", v.ID))
		return
	}
	raw := state.JoinSecrets(v.Status.URLs, a.secretsOf(v.Status))[logsURLKey]
	if v.Status.Phase != state.PhaseRunning || raw == "" {
		c.Header("Retry-After", "2")
		a.problem(c, http.StatusServiceUnavailable, "Dashboard unavailable",
			fmt.Sprintf("the Ray head of session %s is not running (phase %s): its dashboard answers while the session runs", v.ID, v.Status.Phase))
		return
	}
	base, err := state.DashboardURL(raw)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") {
		a.problem(c, http.StatusBadGateway, "Bad gateway", fmt.Sprintf("the agent published an unusable log URL for session %s", v.ID))
		return
	}
	transport := a.cfg.HTTPClient.Transport
	if transport == nil {
		transport = http.DefaultTransport
	}
	proxy := &httputil.ReverseProxy{
		Transport: transport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			u := *base
			u.Path = base.Path + strings.TrimPrefix(c.Param("path"), "/")
			q := pr.In.URL.Query()
			for k, vs := range base.Query() { // exp and key, over any the caller sent
				q[k] = vs
			}
			u.RawQuery = q.Encode()
			pr.Out.URL, pr.Out.Host = &u, u.Host
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del("Cookie")
			pr.Out.Header.Del(OnBehalfOfHeader)
		},
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Set("Content-Security-Policy", dashboardCSP)
			resp.Header.Del("Set-Cookie")
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			a.problem(c, http.StatusBadGateway, "Bad gateway", fmt.Sprintf("the node agent on %v did not answer for the Ray dashboard of session %s: %v", v.Status.Nodes, v.ID, err))
		},
	}
	proxy.ServeHTTP(c.Writer, c.Request)
}
