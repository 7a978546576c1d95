package api

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gorilla/websocket"

	"github.com/voyager-gpu/voyager/internal/wsstream"
	"github.com/voyager-gpu/voyager/state"
)

// Bounds of an exec's command line.
const (
	execMaxArgs  = 256
	execMaxBytes = 64 << 10
)

// streamRoutes adds the streaming routes into a session: exec and
// port-forward. They are for people (an admin, or the session's owner),
// never for a service acting for one: a shell in a session is not
// something JupyterHub does on a user's behalf.
func (a *API) streamRoutes(v1 *gin.RouterGroup) {
	g := v1.Group("", a.denyService)
	g.GET("/sessions/:id/exec", a.execSession)
	g.GET("/sessions/:id/portforward", a.forwardSession)
}

// execSession is GET /api/v1/sessions/:id/exec?cmd=…&tty=&stdin=&cols=&rows=&rank=,
// a WebSocket (internal/wsstream, subprotocol v1.exec.voyager) relayed to
// the agent that runs the session's container (state.AgentExecPath). The
// owner or an admin only (404 for anyone else); the session must be
// Running (409). Every exec is written to the exec audit log before it
// runs, and again with its exit code when it ends.
func (a *API) execSession(c *gin.Context) {
	v, ok := a.loadVisible(c)
	if !ok {
		return
	}
	args := c.QueryArray("cmd")
	total := 0
	for _, s := range args {
		total += len(s)
	}
	if len(args) == 0 || args[0] == "" || len(args) > execMaxArgs || total > execMaxBytes {
		a.invalid(c, "Invalid request", []FieldError{{Field: "query cmd", Message: fmt.Sprintf("want the command and its arguments as 1 to %d cmd parameters (at most %d bytes together), the first not empty: voyager session exec ID -- CMD ARGS…", execMaxArgs, execMaxBytes)}})
		return
	}
	tty, ok1 := boolQuery(c, "tty")
	stdin, ok2 := boolQuery(c, "stdin")
	if !ok1 || !ok2 {
		a.invalid(c, "Invalid request", []FieldError{{Field: "query tty, stdin", Message: "want true or false"}})
		return
	}
	q := url.Values{"cmd": args, "tty": {strconv.FormatBool(tty)}, "stdin": {strconv.FormatBool(stdin)}}
	for _, k := range []string{"cols", "rows"} {
		if s := c.Query(k); s != "" {
			if n, err := strconv.ParseUint(s, 10, 16); err != nil || n == 0 {
				a.invalid(c, "Invalid request", []FieldError{{Field: "query " + k, Message: fmt.Sprintf("got %q, want a terminal size from 1 to 65535", s)}})
				return
			}
			q.Set(k, s)
		}
	}
	target, node, ok := a.streamTarget(c, v, "exec into", state.AgentExecPath, q)
	if !ok {
		return
	}
	rec := ExecRecord{Action: "exec", Command: args, TTY: tty}
	a.relayStream(c, v, node, target, wsstream.ExecProtocol, rec)
}

// forwardSession is GET /api/v1/sessions/:id/portforward?port=P&rank=, a
// WebSocket (subprotocol v1.forward.voyager) carrying one TCP connection
// to port P on the session container's own loopback, through its agent
// (state.AgentForwardPath). Access, phase and audit as execSession.
func (a *API) forwardSession(c *gin.Context) {
	v, ok := a.loadVisible(c)
	if !ok {
		return
	}
	port, err := strconv.Atoi(c.Query("port"))
	if err != nil || port < 1 || port > 65535 {
		a.invalid(c, "Invalid request", []FieldError{{Field: "query port", Message: fmt.Sprintf("got %q, want the session's port to connect to, 1 to 65535", c.Query("port"))}})
		return
	}
	target, node, ok := a.streamTarget(c, v, "forward a port of", state.AgentForwardPath, url.Values{"port": {strconv.Itoa(port)}})
	if !ok {
		return
	}
	a.relayStream(c, v, node, target, wsstream.ForwardProtocol, ExecRecord{Action: "port-forward", Port: port})
}

func boolQuery(c *gin.Context, k string) (bool, bool) {
	s := c.Query(k)
	if s == "" {
		return false, true
	}
	b, err := strconv.ParseBool(s)
	return b, err == nil
}

// streamTarget checks that v can take a stream (Running, an agent
// publishes its endpoints, a WebSocket was asked for) and returns the
// agent's URL for route with query, and the node; it answers c and
// returns false when not.
func (a *API) streamTarget(c *gin.Context, v SessionView, verb, route string, query url.Values) (*url.URL, string, bool) {
	if v.Status.Phase != state.PhaseRunning {
		a.problem(c, http.StatusConflict, "Session not running",
			fmt.Sprintf("cannot %s session %s: it is %s, and only a Running session has a container to reach", verb, v.ID, v.Status.Phase))
		return nil, "", false
	}
	rank := 0
	if r := c.Query("rank"); r != "" {
		n, err := strconv.Atoi(r)
		if err != nil || n < 0 || n >= max(1, len(v.Status.Nodes)) {
			a.invalid(c, "Invalid request", []FieldError{{Field: "query rank", Message: fmt.Sprintf("got %q, want a rank of the session's parts, 0 to %d", r, max(1, len(v.Status.Nodes))-1)}})
			return nil, "", false
		}
		rank = n
	}
	var raw, node string
	if v.Gang() && rank < len(v.Status.Nodes) {
		raw, node = a.partLogURL(v.Status, rank), v.Status.Nodes[rank]
	} else {
		raw = state.JoinSecrets(v.Status.URLs, a.secretsOf(v.Status))[logsURLKey]
		if len(v.Status.Nodes) > 0 {
			node = v.Status.Nodes[0]
		}
	}
	if raw == "" {
		c.Header("Retry-After", "2")
		a.problem(c, http.StatusServiceUnavailable, "Session unreachable",
			fmt.Sprintf("no node agent has published session %s's endpoints yet: its agent does once the container exists", v.ID))
		return nil, "", false
	}
	target, err := state.AgentStreamURL(raw, route, query)
	if err != nil {
		a.problem(c, http.StatusBadGateway, "Bad gateway", fmt.Sprintf("the agent published an unusable log URL for session %s", v.ID))
		return nil, "", false
	}
	if !websocket.IsWebSocketUpgrade(c.Request) {
		a.problem(c, http.StatusBadRequest, "WebSocket required",
			fmt.Sprintf("GET %s opens a WebSocket (Connection: Upgrade, Upgrade: websocket); voyager session exec and voyager session port-forward speak it", c.FullPath()))
		return nil, "", false
	}
	return target, node, true
}

// relayStream writes the start of rec to the audit log, connects to the
// agent at target, accepts the client's WebSocket and relays the two
// until either ends, then writes the end of rec.
func (a *API) relayStream(c *gin.Context, v SessionView, node string, target *url.URL, protocol string, rec ExecRecord) {
	p := principalOf(c)
	rec.Stream = randomStreamID()
	rec.Subject, rec.Admin, rec.Remote = p.Subject, p.Admin && p.Subject != v.Owner, c.ClientIP()
	rec.Session, rec.Owner, rec.Node = v.ID, v.Owner, node
	rec.Event = "start"
	if err := a.auditExec(rec); err != nil {
		a.log.Error("exec audit log unavailable: exec refused", "err", err)
		a.problem(c, http.StatusServiceUnavailable, "Audit log unavailable",
			"every exec and port-forward is recorded before it opens, and the API cannot write its audit log now; an operator must look at the API's log")
		return
	}
	start := time.Now()
	exit := -1
	errText := ""
	defer func() {
		rec.Event, rec.ExitCode, rec.Error, rec.Seconds = "end", &exit, errText, time.Since(start).Seconds()
		_ = a.auditExec(rec)
	}()

	ctx, done := a.streamContext(c)
	defer done()
	d := websocket.Dialer{
		HandshakeTimeout: 15 * time.Second,
		Subprotocols:     []string{protocol},
		ReadBufferSize:   wsstream.ChunkSize,
		WriteBufferSize:  wsstream.ChunkSize,
	}
	if tr, ok := a.cfg.HTTPClient.Transport.(*http.Transport); ok && tr.TLSClientConfig != nil {
		tc := tr.TLSClientConfig.Clone()
		tc.NextProtos = []string{"http/1.1"} // a WebSocket is HTTP/1.1
		d.TLSClientConfig = tc
	} else if target.Scheme == "wss" {
		d.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	agent, resp, err := d.DialContext(ctx, target.String(), nil)
	if err != nil {
		errText = "agent: " + err.Error()
		status, detail := http.StatusBadGateway, fmt.Sprintf("the node agent on %s did not answer for session %s: %v", node, v.ID, err)
		if resp != nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
			resp.Body.Close()
			msg := strings.TrimSpace(string(b))
			errText = "agent: " + msg
			switch resp.StatusCode {
			case http.StatusConflict, http.StatusNotFound:
				status, detail = http.StatusConflict, fmt.Sprintf("session %s: %s", v.ID, msg)
			case http.StatusForbidden, http.StatusBadRequest:
				status, detail = resp.StatusCode, fmt.Sprintf("session %s: %s", v.ID, msg)
			default:
				detail = fmt.Sprintf("the node agent on %s answered %s for session %s: %s", node, resp.Status, v.ID, msg)
			}
		}
		a.problem(c, status, http.StatusText(status), detail)
		return
	}
	agentConn := wsstream.New(agent)
	defer agentConn.Close()
	ws, err := wsstream.Upgrader.Upgrade(c.Writer, c.Request, nil)
	if err != nil {
		errText = "client: " + err.Error()
		return // the upgrader answered
	}
	client := wsstream.New(ws)
	defer client.Close()
	stop := context.AfterFunc(ctx, func() { _ = client.Close(); _ = agentConn.Close() })
	defer stop()
	if protocol == wsstream.ForwardProtocol {
		exit = 0
	}
	err = wsstream.Relay(client, agentConn, func(ch byte, p []byte) {
		if ch == wsstream.Exit {
			var st wsstream.ExitStatus
			if decodeExit(p, &st) == nil {
				exit, errText = st.ExitCode, st.Error
			}
		}
	})
	if err != nil && errText == "" && !errors.Is(err, io.EOF) {
		errText = err.Error()
	}
}

func init() {
	operations = append(operations,
		operation{method: "GET", path: "/api/v1/sessions/{id}/exec", access: "user (the owner, or an admin)", status: 101,
			summary: "Run a command in the session's running container: a WebSocket (subprotocol v1.exec.voyager) whose binary messages start with a channel byte: 0 stdin, 1 stdout, 2 stderr, 3 resize ({\"cols\",\"rows\"}), 4 end of stdin, 5 exit ({\"exitCode\",\"error\"}, the last message). The process runs as the session's user, in its cgroup (its CPU, memory and pids limits), with no capability the session's own process lacks. 404 for anyone but the owner and admins, 409 unless the session is Running. Each exec is recorded in the exec audit log (VOYAGER_API_EXEC_AUDIT_LOG) before it runs and when it ends. voyager session exec speaks it.",
			params:  []param{idParam, {"query", "cmd", "the command, then each argument: repeat the parameter"}, {"query", "tty", "true: a terminal (its output all on stdout)"}, {"query", "stdin", "true: pass the client's input"}, {"query", "cols", "the terminal's first width"}, {"query", "rows", "the terminal's first height"}, {"query", "rank", "a multi-node job's part (default 0)"}}},
		operation{method: "GET", path: "/api/v1/sessions/{id}/portforward", access: "user (the owner, or an admin)", status: 101,
			summary: "Connect to a port inside the session: a WebSocket (subprotocol v1.forward.voyager) carrying one TCP connection to the port on the container's own loopback, channel 0 to it, 1 from it, 4 the client's half-close, 5 the end. Only the session's own network is reached; on an agent with VOYAGER_AGENT_NETWORK=host only the session's allocated ports (403 otherwise). 502 when nothing listens there. Access, phase and audit as exec. voyager session port-forward and voyager ssh speak it.",
			params:  []param{idParam, {"query", "port", "the port inside the session, 1-65535"}, {"query", "rank", "a multi-node job's part (default 0)"}}},
	)
}
