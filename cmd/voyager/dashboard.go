package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"

	"github.com/spf13/cobra"
)

const dashboardLong = `Serves the Ray dashboard of one of your running Ray sessions on a local port
(default 127.0.0.1:8265, Ray's own), for a browser or for Ray's Jobs CLI
(ray job submit --address http://127.0.0.1:8265). Every request goes to the
API with your token, and on through the agent of the session's head, which
reaches the dashboard inside the head's container: the dashboard itself is
published nowhere. Like kubectl port-forward, anyone who can connect to the
local port acts as you: keep it on the loopback. Ctrl-C stops it.`

func newDashboardCmd() *cobra.Command {
	var (
		cf     clientFlags
		listen string
	)
	cmd := &cobra.Command{
		Use:     "dashboard SESSION",
		Short:   "Serve your Ray session's dashboard on a local port",
		Long:    dashboardLong,
		GroupID: groupCLI,
		Args:    cobra.ExactArgs(1),
		RunE: cliRunE(&cf, func(cmd *cobra.Command, c *client, args []string) error {
			return serveDashboard(cmd, c, args[0], listen)
		}),
	}
	cf.register(cmd, false)
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:8265", "local address to serve the dashboard on (port 0: any free port)")
	return cmd
}

// serveDashboard checks that session id's dashboard answers, then proxies
// listen to it until the command's context ends.
func serveDashboard(cmd *cobra.Command, c *client, id, listen string) error {
	ctx := cmd.Context()
	target, err := url.Parse(c.base + "/api/v1/sessions/" + url.PathEscape(id) + "/ray/dashboard")
	if err != nil {
		return cliError(cmd, fmt.Errorf("build dashboard URL: %w", err))
	}
	// The API's answer to the first page says at once what is wrong (no
	// such session, no Ray, not running) rather than on every request.
	resp, err := c.request(ctx, "GET", "/api/v1/sessions/"+url.PathEscape(id)+"/ray/dashboard/", nil, nil)
	if err != nil {
		return cliError(cmd, err)
	}
	resp.Body.Close()
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return cliError(cmd, fmt.Errorf("listen on %s: %w", listen, err))
	}
	local := l.Addr().String()
	proxy := &httputil.ReverseProxy{
		Transport: c.hc.Transport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Header.Set("Authorization", "Bearer "+c.token)
		},
		// This origin serves the dashboard alone, so the API's sandbox
		// (which keeps the dashboard from the API's own origin) is lifted
		// here: the dashboard's scripts call its API on this origin.
		ModifyResponse: func(r *http.Response) error {
			r.Header.Del("Content-Security-Policy")
			return nil
		},
	}
	srv := &http.Server{
		ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// A page elsewhere must not reach the dashboard through the
			// browser (DNS rebinding): only requests addressed to an IP
			// address or to localhost are passed on, never to a name.
			if h, _, err := net.SplitHostPort(r.Host); err != nil || (h != "localhost" && net.ParseIP(h) == nil) {
				http.Error(w, "forbidden: this proxy answers requests for "+local+" (an address or localhost) only", http.StatusForbidden)
				return
			}
			proxy.ServeHTTP(w, r)
		}),
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "Ray dashboard of session %s at http://%s/ (Ctrl-C to stop)\n", id, local)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return cliError(cmd, fmt.Errorf("serve dashboard: %w", err))
	}
	return nil
}
