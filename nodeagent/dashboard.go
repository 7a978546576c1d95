package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"

	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// DashboardPath is the route under which the agent proxies the Ray
// dashboard of a Ray head running here:
// ANY DashboardPath + <container id>/<path>?exp=E&key=K&<the dashboard's own query>.
//
// Ray's dashboard runs jobs for whoever reaches it, so it listens on the
// head container's loopback and is never published: the agent connects to
// it from inside the container's network namespace (the runtime's
// LoopbackDialer), so no other session, on this node or another, has a
// path to it. The key is the one of the head container's log URL
// (status.urls.logs, which only the API and the session's owner see), so
// the API proxies its owner's requests here (api:
// /sessions/{id}/ray/dashboard/) without another secret. exp and key are
// removed before the request goes on, and so are the caller's
// Authorization and Cookie headers.
const DashboardPath = state.AgentDashboardPath

// DashboardHandler serves DashboardPath; mount it on the agent's HTTP
// server beside LogsHandler.
func (a *Agent) DashboardHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, DashboardPath), "/")
		if id == "" || strings.HasPrefix(id, ".") {
			http.Error(w, "not found: want "+DashboardPath+"<container id>/<path>", http.StatusNotFound)
			return
		}
		if code, msg := a.checkKey(id, r.URL.Query()); code != 0 {
			http.Error(w, msg, code)
			return
		}
		dial, token, code, msg := a.dashboardOf(r, id)
		if code != 0 {
			http.Error(w, msg, code)
			return
		}
		proxy := &httputil.ReverseProxy{
			// One connection per request: each is dialled inside the
			// container's network, which a pooled one would not know.
			Transport: &http.Transport{
				DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
				DisableKeepAlives: true,
			},
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "http", "127.0.0.1", "127.0.0.1"
				pr.Out.URL.Path, pr.Out.URL.RawPath = "/"+rest, ""
				q := pr.In.URL.Query()
				q.Del("exp")
				q.Del("key")
				pr.Out.URL.RawQuery = q.Encode()
				pr.Out.Header.Del("Authorization")
				pr.Out.Header.Del("Cookie")
				pr.Out.Header.Del("X-Ray-Authorization")
				if token != "" {
					// Ray's header for proxies (Ray 2.52+ with token
					// authentication, which the session runs with).
					pr.Out.Header.Set("X-Ray-Authorization", "Bearer "+token)
				}
			},
			ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
				a.log.Debug("proxy Ray dashboard", "container", id, "err", err)
				http.Error(w, "the Ray dashboard of container "+id+" did not answer: "+err.Error()+" (Ray may still be starting)", http.StatusBadGateway)
			},
		}
		proxy.ServeHTTP(w, r)
	})
}

// rayToken is the Ray authentication token of session s, from this
// node's copy of its secrets (boundsecrets/<node>/<id>); "" for a session
// that is no Ray gang, or whose bind handed this node none.
func (a *Agent) rayToken(ctx context.Context, s state.Session) (string, error) {
	if s.Ray == nil || s.Ray.Workers == 0 {
		return "", nil
	}
	sec, err := a.boundSecrets(ctx, s.ID)
	if errors.Is(err, errNoSecrets) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read Ray token of %s: %w", s.ID, err)
	}
	return sec.RayToken, nil
}

// dashboardOf is how to reach container id's Ray dashboard, or the HTTP
// status and message of why there is none here.
func (a *Agent) dashboardOf(r *http.Request, id string) (dial func(ctx context.Context) (net.Conn, error), token string, code int, msg string) {
	a.mu.Lock()
	wk := a.workers[id]
	a.mu.Unlock()
	if wk == nil || wk.item.Value.Role != state.RoleHead {
		return nil, "", http.StatusNotFound, "not found: no Ray head runs in container " + id + " on node " + a.cfg.Node
	}
	sess, _, err := state.Get[state.Session](r.Context(), a.cfg.Client, a.cfg.Keys.Session(wk.item.Value.Session))
	if err != nil {
		return nil, "", http.StatusServiceUnavailable, "read the session of " + id + ": " + err.Error()
	}
	if token, err = a.rayToken(r.Context(), sess); err != nil {
		return nil, "", http.StatusServiceUnavailable, err.Error()
	}
	dialer, ok := a.cfg.Runtime.(runtime.LoopbackDialer)
	if !ok {
		return nil, "", http.StatusNotImplemented, "this node's container runtime cannot reach a container's loopback"
	}
	info, err := a.cfg.Runtime.Status(r.Context(), id)
	if err != nil || info.State != runtime.StateRunning {
		return nil, "", http.StatusServiceUnavailable, "the Ray head " + id + " is not running"
	}
	p, err := SplitPorts(state.SessionKind(info.Labels[LabelKind]), state.RoleHead, wk.item.Value.Ports)
	if err != nil || p.RayDash == 0 {
		return nil, "", http.StatusNotFound, "not found: container " + id + " has no dashboard port"
	}
	return func(ctx context.Context) (net.Conn, error) { return dialer.DialLoopback(ctx, id, p.RayDash) }, token, 0, ""
}
