package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
	"github.com/spf13/cobra"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/internal/wsstream"
)

const execLong = `Runs a command in one of your running sessions (an admin: in anyone's), as
the session's own user, under its CPU, memory and pids limits and with no
privilege the session lacks, and exits with the command's exit code (126
when it could not be run, 127 when the image has no such command).

  voyager session exec ID -- nvidia-smi
  voyager session exec ID -it -- bash          # an interactive shell
  voyager session exec ID -i -- sh -c 'cat > data.csv' < data.csv

-i passes your input to the command; -t gives it a terminal (your own
must be one), which follows your window's size. A multi-node job's other
parts are reached with --rank. Every exec is recorded in the API's audit
log: who, when, which session, what command, how it ended.`

func newSessionExecCmd() *cobra.Command {
	var (
		cf         clientFlags
		stdin, tty bool
		rank       int
	)
	cmd := &cobra.Command{
		Use:               "exec ID [-i] [-t] -- COMMAND [ARGS…]",
		Short:             "Run a command in a running session (a shell with -it)",
		Long:              execLong,
		Args:              execArgs,
		ValidArgsFunction: completeSessionIDs(&cf),
		RunE: cliRunE(&cf, func(cmd *cobra.Command, c *client, args []string) error {
			return sessionExec(cmd, c, args[0], args[1:], stdin, tty, rank)
		}),
	}
	cf.register(cmd, false)
	cmd.Flags().BoolVarP(&stdin, "stdin", "i", false, "pass standard input to the command")
	cmd.Flags().BoolVarP(&tty, "tty", "t", false, "give the command a terminal (with -i: an interactive shell)")
	cmd.Flags().IntVar(&rank, "rank", 0, "a multi-node job's part to run in (0: the first)")
	return cmd
}

// execArgs wants the session and, after --, a command.
func execArgs(cmd *cobra.Command, args []string) error {
	dash := cmd.ArgsLenAtDash()
	switch {
	case len(args) == 0:
		return fmt.Errorf("want a session ID and, after --, the command to run: voyager session exec ID -- COMMAND")
	case dash == -1 && len(args) > 1:
		return fmt.Errorf("put the command after --: voyager session exec %s -- %s", args[0], strings.Join(args[1:], " "))
	case dash != 1:
		return fmt.Errorf("want one session ID before --, got %d: voyager session exec ID -- COMMAND", max(dash, 0))
	case len(args) < 2:
		return fmt.Errorf("want the command to run after --: voyager session exec %s -- COMMAND", args[0])
	}
	return nil
}

// dialStream opens the WebSocket of an exec or port-forward route of the
// API. A refusal is an *apiError with the API's problem.
func (c *client) dialStream(ctx context.Context, path string, q url.Values, protocol string) (*wsstream.Conn, error) {
	u, err := url.Parse(c.base + path)
	if err != nil {
		return nil, fmt.Errorf("build stream URL: %w", err)
	}
	switch u.Scheme {
	case "https":
		u.Scheme = "wss"
	default:
		u.Scheme = "ws"
	}
	u.RawQuery = q.Encode()
	d := websocket.Dialer{
		HandshakeTimeout: 30 * time.Second,
		Subprotocols:     []string{protocol},
		ReadBufferSize:   wsstream.ChunkSize,
		WriteBufferSize:  wsstream.ChunkSize,
		Proxy:            http.ProxyFromEnvironment,
	}
	if tr, ok := c.hc.Transport.(*http.Transport); ok && tr.TLSClientConfig != nil {
		tc := tr.TLSClientConfig.Clone()
		tc.NextProtos = []string{"http/1.1"}
		d.TLSClientConfig = tc
	} else if u.Scheme == "wss" {
		d.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	ws, resp, err := d.DialContext(ctx, u.String(), http.Header{"Authorization": {"Bearer " + c.token}})
	if err != nil {
		if resp != nil {
			return nil, answerError(resp)
		}
		return nil, fmt.Errorf("call %s (%s): %w", c.base, envURL, err)
	}
	return wsstream.New(ws), nil
}

// Exit codes of an exec that did not run its command (as POSIX shells
// and docker exec use them).
const (
	exitCannotRun = 126
	exitNoCommand = 127
)

func sessionExec(cmd *cobra.Command, c *client, id string, command []string, withStdin, tty bool, rank int) error {
	ctx := cmd.Context()
	in := cmd.InOrStdin()
	inFile, _ := in.(*os.File)
	if tty && (inFile == nil || !isTerminal(int(inFile.Fd()))) {
		fmt.Fprintln(cmd.ErrOrStderr(), "voyager session exec: -t: standard input is not a terminal; running without one")
		tty = false
	}
	q := url.Values{"cmd": command, "tty": {strconv.FormatBool(tty)}, "stdin": {strconv.FormatBool(withStdin)}}
	if rank > 0 {
		q.Set("rank", strconv.Itoa(rank))
	}
	if tty {
		if cols, rows, ok := termSize(int(inFile.Fd())); ok {
			q.Set("cols", strconv.Itoa(int(cols)))
			q.Set("rows", strconv.Itoa(int(rows)))
		}
	}
	conn, err := c.dialStream(ctx, "/api/v1/sessions/"+url.PathEscape(id)+"/exec", q, wsstream.ExecProtocol)
	if err != nil {
		return cliError(cmd, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()

	if tty {
		fd := int(inFile.Fd())
		restore, err := makeRaw(fd)
		if err != nil {
			return cliError(cmd, fmt.Errorf("set the terminal to raw mode: %w", err))
		}
		defer restore()
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				if cols, rows, ok := termSize(fd); ok {
					_ = conn.SendJSON(wsstream.Resize, wsstream.TermSize{Cols: cols, Rows: rows})
				}
			}
		}()
	}
	if withStdin {
		go func() {
			buf := make([]byte, wsstream.ChunkSize)
			for {
				n, err := in.Read(buf)
				if n > 0 {
					if conn.Send(wsstream.Stdin, buf[:n]) != nil {
						return
					}
				}
				if err != nil {
					_ = conn.Send(wsstream.CloseStdin, nil)
					return
				}
			}
		}()
	}
	stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
	for {
		ch, p, err := conn.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return exitCode(exitError)
			}
			return cliError(cmd, fmt.Errorf("the exec's stream ended before the command's exit: %w", err))
		}
		switch ch {
		case wsstream.Stdout:
			_, _ = stdout.Write(p)
		case wsstream.Stderr:
			_, _ = stderr.Write(p)
		case wsstream.Exit:
			var st wsstream.ExitStatus
			if err := json.Unmarshal(p, &st); err != nil {
				return cliError(cmd, fmt.Errorf("decode the exec's exit: %w", err))
			}
			if st.Error != "" {
				fmt.Fprintf(stderr, "voyager session exec: %s\n", st.Error)
				if strings.Contains(st.Error, "no such command") {
					return exitCode(exitNoCommand)
				}
				return exitCode(exitCannotRun)
			}
			if st.ExitCode != 0 {
				return exitCode(st.ExitCode)
			}
			return nil
		}
	}
}

// sessionRunning reads session id and fails unless it is Running: what a
// port-forward checks before it listens.
func (c *client) sessionRunning(ctx context.Context, id string) error {
	var v api.SessionView
	if err := c.do(ctx, "GET", "/api/v1/sessions/"+url.PathEscape(id), nil, &v); err != nil {
		return err
	}
	if v.Status.Phase != "Running" {
		return fmt.Errorf("session %s is %s: only a Running session has ports to reach", id, v.Status.Phase)
	}
	return nil
}
