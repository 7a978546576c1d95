package api

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

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
	if v.Gang() {
		a.jobLogs(c, v, tail, follow)
		return
	}
	raw := state.JoinSecrets(v.Status.URLs, a.secretsOf(v.Status))[logsURLKey]
	if raw == "" {
		c.Header("Retry-After", "2")
		a.problem(c, http.StatusServiceUnavailable, "Logs unavailable",
			fmt.Sprintf("no node agent serves logs for session %s yet (phase %s): the agent that runs a session publishes its log endpoint in status.urls.logs once the container exists", v.ID, v.Status.Phase))
		return
	}
	ctx, done := a.streamContext(c)
	defer done()
	resp, ok := a.openLog(c, ctx, v, raw, tail, follow)
	if !ok {
		return
	}
	defer resp.Body.Close()
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

// openLog asks the agent at the log URL raw for a log, answering c with a
// problem (and false) when it cannot.
func (a *API) openLog(c *gin.Context, ctx context.Context, v SessionView, raw string, tail int, follow bool) (*http.Response, bool) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		a.problem(c, http.StatusBadGateway, "Bad gateway", fmt.Sprintf("the agent published an unusable log URL for session %s", v.ID))
		return nil, false
	}
	q := u.Query()
	q.Set("tail", strconv.Itoa(tail))
	q.Set("follow", strconv.FormatBool(follow))
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		a.internal(c, "build log request", err)
		return nil, false
	}
	resp, err := a.cfg.HTTPClient.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			a.problem(c, http.StatusBadGateway, "Bad gateway", fmt.Sprintf("the node agent of %s did not answer for the logs of session %s: %v", u.Host, v.ID, errors.Unwrap(err)))
		}
		return nil, false
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		a.problem(c, http.StatusBadGateway, "Bad gateway", fmt.Sprintf("the node agent answered %s for the logs of session %s: %s", resp.Status, v.ID, b))
		return nil, false
	}
	return resp, true
}

// partLogURL is the log URL of the part of a multi-node job on the node
// at rank in its status's nodes: rank 0's is in the status (with its key
// in that node's secrets), every other part's agent writes its own to
// secrets/<node>/<id>.
func (a *API) partLogURL(st state.Status, rank int) string {
	key := a.keys.Secret(st.Nodes[rank], st.Session)
	sec, ok := a.secrets.Get(key)
	if !ok {
		ctx, cancel := context.WithTimeout(a.streams, 2*time.Second)
		defer cancel()
		sec, _, _ = state.Get[state.Secrets](ctx, a.cli, key)
	}
	if rank == 0 {
		return state.JoinSecrets(st.URLs, sec)[logsURLKey]
	}
	return sec.URLs[logsURLKey]
}

// jobLogs serves the logs of a multi-node job: every part's, each line
// prefixed with its rank ("[rank 1] "), as the lines come; or, with
// ?rank=N, that part's alone, unprefixed. The ranks are the job's nodes in
// its status's order (rank 0 first). While the job runs, a followed log
// waits (503) until every part has published its log, so that no part's
// first lines are missed.
func (a *API) jobLogs(c *gin.Context, v SessionView, tail int, follow bool) {
	ranks := make([]int, len(v.Status.Nodes))
	for i := range ranks {
		ranks[i] = i
	}
	prefix := true
	if r := c.Query("rank"); r != "" {
		n, err := strconv.Atoi(r)
		if most := v.JobNodes(v.Status); err != nil || n < 0 || n >= most { // an elastic job: the ranks of its current attempt
			a.invalid(c, "Invalid request", []FieldError{{Field: "query rank", Message: fmt.Sprintf("got %q, want a rank of the job, 0 to %d", r, most-1)}})
			return
		}
		if n >= len(ranks) {
			ranks = nil
		} else {
			ranks, prefix = []int{n}, false
		}
	}
	urls := map[int]string{}
	var missing []string
	for _, r := range ranks {
		if u := a.partLogURL(v.Status, r); u != "" {
			urls[r] = u
		} else {
			missing = append(missing, strconv.Itoa(r))
		}
	}
	if len(urls) == 0 || (follow && len(missing) > 0 && !v.Status.Phase.Terminal()) {
		c.Header("Retry-After", "2")
		a.problem(c, http.StatusServiceUnavailable, "Logs unavailable",
			fmt.Sprintf("the node agents of job %s (phase %s) have not all published their parts' log endpoints yet (missing: rank %s): each part's agent does once its container exists", v.ID, v.Status.Phase, strings.Join(missing, ", rank ")))
		return
	}
	ctx, done := a.streamContext(c)
	defer done()
	var bodies []io.ReadCloser
	var labels []string
	defer func() {
		for _, b := range bodies {
			b.Close()
		}
	}()
	for _, r := range ranks {
		raw, ok := urls[r]
		if !ok {
			continue // an ended job's part that never started
		}
		resp, ok := a.openLog(c, ctx, v, raw, tail, follow)
		if !ok {
			return
		}
		bodies = append(bodies, resp.Body)
		label := ""
		if prefix {
			label = "[rank " + strconv.Itoa(r) + "] "
		}
		labels = append(labels, label)
	}
	c.Header("Content-Type", "text/plain; charset=utf-8")
	c.Header("X-Accel-Buffering", "no")
	c.Status(http.StatusOK)
	c.Writer.WriteHeaderNow()
	c.Writer.Flush()
	var mu sync.Mutex // one line at a time, whole
	var wg sync.WaitGroup
	for i, body := range bodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(body)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				mu.Lock()
				_, err := fmt.Fprintf(c.Writer, "%s%s\n", labels[i], sc.Bytes())
				if err == nil {
					c.Writer.Flush()
				}
				mu.Unlock()
				if err != nil {
					done()
					return
				}
			}
		}()
	}
	wg.Wait()
}
