package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/spf13/cobra"

	"github.com/voyager-gpu/voyager/internal/wsstream"
)

const portForwardLong = `Forwards local ports to ports inside one of your running sessions (an
admin: anyone's), like kubectl port-forward: each connection to the local
port is carried through the API and the session's node agent to the port
on the session's own loopback, so a server the session keeps private (a
TensorBoard, a debugger, sshd) is reachable from your machine and from
nowhere else. Ctrl-C stops it.

  voyager session port-forward ID 6006           # localhost:6006 -> 6006 in the session
  voyager session port-forward ID 8080:6006      # localhost:8080 -> 6006
  voyager session port-forward ID :6006          # a free local port -> 6006 (printed)

Anyone who can connect to the local port reaches the session's port as
you: keep --address on the loopback. Every connection is recorded in the
API's audit log.`

// forwardSpec is one [LOCAL:]REMOTE of voyager session port-forward.
type forwardSpec struct{ local, remote int }

func parseForwardSpec(s string) (forwardSpec, error) {
	localS, remoteS, hasLocal := strings.Cut(s, ":")
	if !hasLocal {
		localS, remoteS = s, s
	}
	bad := fmt.Errorf("port %q: want [LOCAL:]REMOTE, ports from 1 to 65535 (LOCAL empty or 0: any free port), such as 8888, 8080:8888 or :8888", s)
	remote, err := strconv.Atoi(remoteS)
	if err != nil || remote < 1 || remote > 65535 {
		return forwardSpec{}, bad
	}
	local := 0
	if localS != "" {
		if local, err = strconv.Atoi(localS); err != nil || local < 0 || local > 65535 {
			return forwardSpec{}, bad
		}
	}
	return forwardSpec{local: local, remote: remote}, nil
}

func newSessionPortForwardCmd() *cobra.Command {
	var (
		cf      clientFlags
		address string
		rank    int
	)
	cmd := &cobra.Command{
		Use:               "port-forward ID [LOCAL:]REMOTE…",
		Aliases:           []string{"forward"},
		Short:             "Forward local ports to ports inside a running session",
		Long:              portForwardLong,
		Args:              minArgsWithHint(2, "want a session ID and at least one [LOCAL:]REMOTE port: voyager session port-forward ID 8888"),
		ValidArgsFunction: completeSessionIDs(&cf),
		RunE: cliRunE(&cf, func(cmd *cobra.Command, c *client, args []string) error {
			var specs []forwardSpec
			for _, a := range args[1:] {
				s, err := parseForwardSpec(a)
				if err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "voyager session port-forward: %v\n", err)
					return exitCode(exitUsage)
				}
				specs = append(specs, s)
			}
			return portForward(cmd, c, args[0], address, rank, specs)
		}),
	}
	cf.register(cmd, false)
	cmd.Flags().StringVar(&address, "address", "127.0.0.1", "local address to listen on")
	cmd.Flags().IntVar(&rank, "rank", 0, "a multi-node job's part to forward to (0: the first)")
	return cmd
}

// minArgsWithHint is cobra.MinimumNArgs with a message that says what to
// type.
func minArgsWithHint(n int, hint string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) < n {
			return errors.New(hint)
		}
		return nil
	}
}

func portForward(cmd *cobra.Command, c *client, id, address string, rank int, specs []forwardSpec) error {
	ctx := cmd.Context()
	if err := c.sessionRunning(ctx, id); err != nil {
		return cliError(cmd, err)
	}
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for _, s := range specs {
		l, err := net.Listen("tcp", net.JoinHostPort(address, strconv.Itoa(s.local)))
		if err != nil {
			return cliError(cmd, fmt.Errorf("listen on %s port %d: %w", address, s.local, err))
		}
		ls = append(ls, l)
		fmt.Fprintf(cmd.OutOrStdout(), "Forwarding from %s -> %d\n", l.Addr(), s.remote)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stderr := &lockedWriter{w: cmd.ErrOrStderr()}
	for i, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer conn.Close()
					if err := forwardConn(ctx, c, id, specs[i].remote, rank, conn, conn); err != nil && ctx.Err() == nil {
						fmt.Fprintf(stderr, "voyager session port-forward: connection to port %d of session %s: %v\n", specs[i].remote, id, err)
					}
				}()
			}
		}()
	}
	<-ctx.Done()
	for _, l := range ls {
		_ = l.Close()
	}
	return nil
}

// forwardConn carries one connection (in, read until EOF; out, written)
// to port in session id, until either side ends it.
func forwardConn(ctx context.Context, c *client, id string, port, rank int, in io.Reader, out io.Writer) error {
	q := url.Values{"port": {strconv.Itoa(port)}}
	if rank > 0 {
		q.Set("rank", strconv.Itoa(rank))
	}
	conn, err := c.dialStream(ctx, "/api/v1/sessions/"+url.PathEscape(id)+"/portforward", q, wsstream.ForwardProtocol)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	go func() {
		buf := make([]byte, wsstream.ChunkSize)
		for {
			n, err := in.Read(buf)
			if n > 0 && conn.Send(wsstream.Stdin, buf[:n]) != nil {
				return
			}
			if err != nil {
				_ = conn.Send(wsstream.CloseStdin, nil)
				return
			}
		}
	}()
	for {
		ch, p, err := conn.Recv()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		switch ch {
		case wsstream.Stdout:
			if _, err := out.Write(p); err != nil {
				return err
			}
		case wsstream.Exit:
			var st wsstream.ExitStatus
			if json.Unmarshal(p, &st) == nil && st.Error != "" {
				return errors.New(st.Error)
			}
			if cw, ok := out.(interface{ CloseWrite() error }); ok {
				_ = cw.CloseWrite()
			}
			return nil
		}
	}
}

// lockedWriter serialises writes of concurrent connections' messages.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

const sshLong = `Connects standard input and output to the SSH server of one of your
running sessions, for OpenSSH's ProxyCommand: nothing of the session is
published, and the connection goes through the API with your token, like
voyager session port-forward.

  ssh -o ProxyCommand='voyager ssh %h' jovyan@SESSION_ID

or once for every session, in ~/.ssh/config (then ssh SESSION_ID.voyager,
and VS Code's Remote-SSH: Connect to Host… SESSION_ID.voyager):

  Host *.voyager
      User jovyan
      ProxyCommand voyager ssh %h
      StrictHostKeyChecking accept-new

HOST is the session ID, or the session ID followed by a dot and anything.
The session's image must run sshd on its loopback: docs/ssh.md has the
recipe (deploy/images/sshd: Debian's openssh-server, started as the
session's own user on port 2222).`

func newSSHCmd() *cobra.Command {
	var (
		cf   clientFlags
		port int
		rank int
	)
	cmd := &cobra.Command{
		Use:               "ssh HOST",
		Short:             "Reach a session's sshd: an OpenSSH ProxyCommand (VS Code Remote-SSH)",
		Long:              sshLong,
		GroupID:           groupCLI,
		Args:              exactArgs(1),
		ValidArgsFunction: completeSessionIDs(&cf),
		RunE: cliRunE(&cf, func(cmd *cobra.Command, c *client, args []string) error {
			id, _, _ := strings.Cut(args[0], ".")
			if err := forwardConn(cmd.Context(), c, id, port, rank, cmd.InOrStdin(), cmd.OutOrStdout()); err != nil && cmd.Context().Err() == nil {
				return cliError(cmd, err)
			}
			return nil
		}),
	}
	cf.register(cmd, false)
	cmd.Flags().IntVar(&port, "port", 2222, "the port sshd listens on inside the session (voyager-sshd's: 2222)")
	cmd.Flags().IntVar(&rank, "rank", 0, "a multi-node job's part to reach (0: the first)")
	return cmd
}
