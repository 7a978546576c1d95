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

	"github.com/voyager-gpu/voyager/internal/wsstream"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// ExecPath is the route under which the agent runs a command in a
// session's running container:
// GET ExecPath + <container id>?exp=E&key=K&cmd=ARG…&tty=true&stdin=true&cols=C&rows=R,
// a WebSocket framed by internal/wsstream (subprotocol
// wsstream.ExecProtocol).
//
// Like the Ray dashboard, it is opened by the key of the container's log
// URL, which only the API (and so, through it, the session's owner or an
// admin) can read: the API authenticates the person, writes the exec into
// its audit log and relays the stream. The process is the container's own
// in all but its arguments (runtime.Containerd.Exec): its user, cgroup
// limits, capabilities and profiles.
const ExecPath = state.AgentExecPath

// ForwardPath is the route under which the agent connects to a port of a
// session's running container: GET ForwardPath + <container id>?exp=E&key=K&port=P,
// a WebSocket (wsstream.ForwardProtocol) carrying one TCP connection.
//
// The connection is made to the container's own loopback from inside its
// network namespace (runtime.LoopbackDialer), so it reaches what listens
// in the session and nothing else. On the host's network
// (VOYAGER_AGENT_NETWORK=host) the loopback is the machine's, so there
// only the ports the session was allocated may be forwarded.
const ForwardPath = state.AgentForwardPath

// execMaxArgs bounds an exec's command line.
const execMaxArgs = 256

// streamCloseWait is how long a handler waits, after its last message, for
// the peer to close the WebSocket.
const streamCloseWait = 5 * time.Second

// ExecHandler serves ExecPath; mount it on the agent's HTTP server beside
// LogsHandler.
func (a *Agent) ExecHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, code, msg := a.streamTarget(r, ExecPath)
		if code != 0 {
			http.Error(w, msg, code)
			return
		}
		q := r.URL.Query()
		args := q["cmd"]
		if len(args) == 0 || args[0] == "" || len(args) > execMaxArgs {
			http.Error(w, fmt.Sprintf("bad request: want the command as 1 to %d cmd parameters", execMaxArgs), http.StatusBadRequest)
			return
		}
		ex, ok := a.cfg.Runtime.(runtime.Execer)
		if !ok {
			http.Error(w, "this node's container runtime cannot run a command in a container", http.StatusNotImplemented)
			return
		}
		tty, _ := strconv.ParseBool(q.Get("tty"))
		withStdin, _ := strconv.ParseBool(q.Get("stdin"))
		var size runtime.TermSize
		if c, err := strconv.ParseUint(q.Get("cols"), 10, 16); err == nil {
			size.Cols = uint16(c)
		}
		if rw, err := strconv.ParseUint(q.Get("rows"), 10, 16); err == nil {
			size.Rows = uint16(rw)
		}
		ws, err := wsstream.Upgrader.Upgrade(w, r, nil)
		if err != nil {
			return // the upgrader answered
		}
		conn := wsstream.New(ws)
		defer conn.Close()
		ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
		defer cancel()

		inR, inW := io.Pipe()
		resize := make(chan runtime.TermSize, 4)
		readDone := make(chan struct{})
		go func() {
			defer close(readDone)
			// The client gone (its WebSocket closed or broken) ends the
			// process: nobody reads its output any more.
			defer cancel()
			defer inW.Close()
			for {
				ch, p, err := conn.Recv()
				if err != nil {
					return
				}
				switch ch {
				case wsstream.Stdin:
					if withStdin {
						if _, err := inW.Write(p); err != nil {
							return
						}
					}
				case wsstream.CloseStdin:
					_ = inW.Close()
				case wsstream.Resize:
					var sz wsstream.TermSize
					if json.Unmarshal(p, &sz) == nil {
						select {
						case resize <- runtime.TermSize{Cols: sz.Cols, Rows: sz.Rows}:
						default: // a burst of resizes: the last ones win later
						}
					}
				}
			}
		}()
		opts := runtime.ExecOptions{Args: args, TTY: tty, Stdout: conn.Writer(wsstream.Stdout), Size: size, Resize: resize}
		if !tty {
			opts.Stderr = conn.Writer(wsstream.Stderr)
		}
		if withStdin {
			opts.Stdin = inR
		}
		a.log.Debug("exec", "container", id, "tty", tty, "stdin", withStdin)
		exit, err := ex.Exec(ctx, id, opts)
		st := wsstream.ExitStatus{ExitCode: exit}
		if err != nil {
			st = wsstream.ExitStatus{ExitCode: -1, Error: execError(id, args[0], err)}
			a.log.Debug("exec failed", "container", id, "err", err)
		}
		_ = inR.Close()
		_ = conn.SendExit(st)
		select {
		case <-readDone:
		case <-time.After(streamCloseWait):
		}
	})
}

// execError is what an exec's caller is told of err.
func execError(id, cmd string, err error) string {
	switch {
	case errors.Is(err, runtime.ErrNotRunning), errors.Is(err, runtime.ErrNotFound):
		return "the session's container " + id + " is not running"
	case errors.Is(err, context.Canceled):
		return "the exec ended: its client went away"
	}
	msg := err.Error()
	if strings.Contains(msg, "executable file not found") || strings.Contains(msg, "no such file or directory") {
		return fmt.Sprintf("cannot run %q in the session: no such command in its image (%v)", cmd, err)
	}
	return fmt.Sprintf("cannot run %q in the session: %v", cmd, err)
}

// ForwardHandler serves ForwardPath; mount it on the agent's HTTP server
// beside LogsHandler.
func (a *Agent) ForwardHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, code, msg := a.streamTarget(r, ForwardPath)
		if code != 0 {
			http.Error(w, msg, code)
			return
		}
		port, err := strconv.Atoi(r.URL.Query().Get("port"))
		if err != nil || port < 1 || port > 65535 {
			http.Error(w, fmt.Sprintf("bad request: port %q: want a port number from 1 to 65535", r.URL.Query().Get("port")), http.StatusBadRequest)
			return
		}
		dialer, ok := a.cfg.Runtime.(runtime.LoopbackDialer)
		if !ok {
			http.Error(w, "this node's container runtime cannot reach a container's loopback", http.StatusNotImplemented)
			return
		}
		if iso, ok := a.cfg.Runtime.(interface{ Isolated() bool }); !ok || !iso.Isolated() {
			// The container's loopback is the machine's: etcd, the agent
			// and every other session's ports are there.
			var ports []int
			a.mu.Lock()
			if wk := a.workers[id]; wk != nil {
				ports = slices.Clone(wk.item.Value.Ports)
			}
			a.mu.Unlock()
			if !slices.Contains(ports, port) {
				http.Error(w, fmt.Sprintf("forbidden: port %d is not the session's: on node %s sessions share the machine's network, so only the ports allocated to the session (%v) can be forwarded", port, a.cfg.Node, ports), http.StatusForbidden)
				return
			}
		}
		dctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		tcp, err := dialer.DialLoopback(dctx, id, port)
		cancel()
		if err != nil {
			http.Error(w, fmt.Sprintf("nothing in the session answers on port %d: %v", port, errors.Unwrap(err)), http.StatusBadGateway)
			return
		}
		defer tcp.Close()
		ws, err := wsstream.Upgrader.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		conn := wsstream.New(ws)
		defer conn.Close()
		a.log.Debug("port forward", "container", id, "port", port)
		readDone := make(chan struct{})
		go func() {
			defer close(readDone)
			for {
				ch, p, err := conn.Recv()
				if err != nil {
					_ = tcp.Close() // the client is gone
					return
				}
				switch ch {
				case wsstream.Stdin:
					if _, err := tcp.Write(p); err != nil {
						return
					}
				case wsstream.CloseStdin:
					if cw, ok := tcp.(interface{ CloseWrite() error }); ok {
						_ = cw.CloseWrite()
					}
				}
			}
		}()
		_, err = io.CopyBuffer(conn.Writer(wsstream.Stdout), tcp, make([]byte, wsstream.ChunkSize))
		st := wsstream.ExitStatus{}
		if err != nil && !errors.Is(err, net.ErrClosed) {
			st = wsstream.ExitStatus{ExitCode: -1, Error: fmt.Sprintf("port %d in the session: %v", port, err)}
		}
		_ = conn.SendExit(st)
		select {
		case <-readDone:
		case <-time.After(streamCloseWait):
		}
	})
}

// streamTarget checks a request for route: the container id after it, the
// key, and that the container is a running session's of this agent. It
// returns the id, or the HTTP status and message of a refusal.
func (a *Agent) streamTarget(r *http.Request, route string) (string, int, string) {
	if r.Method != http.MethodGet {
		return "", http.StatusMethodNotAllowed, "method not allowed: use GET with a WebSocket upgrade"
	}
	id := strings.TrimPrefix(r.URL.Path, route)
	if id == "" || strings.ContainsAny(id, "/\\") || strings.HasPrefix(id, ".") {
		return "", http.StatusNotFound, "not found: want " + route + "<container id>"
	}
	if code, msg := a.checkKey(id, r.URL.Query()); code != 0 {
		return "", code, msg
	}
	a.mu.Lock()
	wk := a.workers[id]
	a.mu.Unlock()
	if wk == nil {
		return "", http.StatusNotFound, "not found: no session's container " + id + " runs on node " + a.cfg.Node
	}
	info, err := a.cfg.Runtime.Status(r.Context(), id)
	if err != nil || info.State != runtime.StateRunning {
		return "", http.StatusConflict, "the session's container " + id + " is not running"
	}
	return id, 0, ""
}
