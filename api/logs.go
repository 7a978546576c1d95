package api

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/gin-gonic/gin"

	"github.com/voyager-gpu/voyager/state"
)

// logsURLKey is the key in status.urls under which the node agent that
// runs a session publishes the URL of that session's log endpoint.
//
// The contract with the agent: GET <urls.logs>?tail=N&follow=true|false
// answers 200 with text/plain, the container's stdout and stderr as lines
// (tail=N: only the last N lines, 0: all); with follow=true the response
// stays open and streams new lines until the container exits, then ends.
// The API proxies that stream unchanged to the session's owner; the URL
// itself is never shown to clients.
const logsURLKey = "logs"

// maxTail bounds ?tail.
const maxTail = 100000

func (a *API) sessionLogs(c *gin.Context) {
	v, ok := a.loadVisible(c)
	if !ok {
		return
	}
	tail := 0
	if t := c.Query("tail"); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil || n < 0 || n > maxTail {
			a.invalid(c, "Invalid request", []FieldError{{Field: "query tail", Message: fmt.Sprintf("got %q, want a whole number of lines from 0 (all) to %d", t, maxTail)}})
			return
		}
		tail = n
	}
	follow := false
	if f := c.Query("follow"); f != "" {
		b, err := strconv.ParseBool(f)
		if err != nil {
			a.invalid(c, "Invalid request", []FieldError{{Field: "query follow", Message: fmt.Sprintf("got %q, want true or false", f)}})
			return
		}
		follow = b
	}
	raw := state.JoinSecrets(v.Status.URLs, a.secretsOf(v.Status))[logsURLKey]
	if raw == "" {
		c.Header("Retry-After", "2")
		a.problem(c, http.StatusServiceUnavailable, "Logs unavailable",
			fmt.Sprintf("no node agent serves logs for session %s yet (phase %s): the agent that runs a session publishes its log endpoint in status.urls.logs once the container exists", v.ID, v.Status.Phase))
		return
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		a.problem(c, http.StatusBadGateway, "Bad gateway", fmt.Sprintf("the agent published an unusable log URL for session %s", v.ID))
		return
	}
	q := u.Query()
	q.Set("tail", strconv.Itoa(tail))
	q.Set("follow", strconv.FormatBool(follow))
	u.RawQuery = q.Encode()
	ctx, done := a.streamContext(c)
	defer done()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		a.internal(c, "build log request", err)
		return
	}
	resp, err := a.cfg.HTTPClient.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		a.problem(c, http.StatusBadGateway, "Bad gateway", fmt.Sprintf("the node agent on %v did not answer for the logs of session %s: %v", v.Status.Nodes, v.ID, errors.Unwrap(err)))
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		a.problem(c, http.StatusBadGateway, "Bad gateway", fmt.Sprintf("the node agent answered %s for the logs of session %s: %s", resp.Status, v.ID, b))
		return
	}
	c.Header("Content-Type", "text/plain; charset=utf-8")
	c.Header("X-Accel-Buffering", "no")
	c.Status(http.StatusOK)
	// Headers now: a followed log with no output yet is still an answer.
	c.Writer.WriteHeaderNow()
	c.Writer.Flush()
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := c.Writer.Write(buf[:n]); werr != nil {
				return
			}
			c.Writer.Flush()
		}
		if rerr != nil {
			return
		}
	}
}
