package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	containerd "github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// ErrNotRunning means the container exists but its process is not running,
// so nothing can be executed in it.
var ErrNotRunning = errors.New("container not running")

// TermSize is a terminal's size in character cells.
type TermSize struct{ Cols, Rows uint16 }

// ExecOptions describe a process to run in a running container.
type ExecOptions struct {
	// Args is the command and its arguments; required.
	Args []string
	// TTY gives the process a terminal: its output, stdout and stderr
	// together, goes to Stdout.
	TTY bool
	// Stdin feeds the process's standard input until it returns io.EOF,
	// when the process sees its input end; nil: no input.
	Stdin io.Reader
	// Stdout and Stderr receive its output; nil discards it.
	Stdout, Stderr io.Writer
	// Size is the terminal's first size (TTY only; zero: the runtime's).
	Size TermSize
	// Resize delivers later sizes of the terminal (TTY only); nil: none.
	Resize <-chan TermSize
}

// Execer is a Runtime that can run another process inside a running
// container (Containerd; not the fake, which runs no process).
type Execer interface {
	Exec(ctx context.Context, id string, opts ExecOptions) (int, error)
}

var _ Execer = (*Containerd)(nil)

// Exec runs opts.Args inside running container id and returns its exit
// code once it has exited and its output has been written. The process is
// the container's own in all but its arguments and terminal: the same
// user and groups, capabilities (none added), environment, working
// directory, rlimits, seccomp and AppArmor profiles, in the container's
// cgroup (so under its CPU, memory and pids limits) and namespaces. When
// ctx ends first the process is killed. A container that is not running
// is ErrNotRunning, an unknown id ErrNotFound.
func (c *Containerd) Exec(ctx context.Context, id string, opts ExecOptions) (int, error) {
	if len(opts.Args) == 0 || opts.Args[0] == "" {
		return -1, fmt.Errorf("exec in container %s: %w: no command", id, ErrInvalidSpec)
	}
	cont, err := c.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return -1, fmt.Errorf("exec in container %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return -1, fmt.Errorf("exec in container %s: %w", id, err)
	}
	task, err := cont.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return -1, fmt.Errorf("exec in container %s: %w", id, ErrNotRunning)
	}
	if err != nil {
		return -1, fmt.Errorf("exec in container %s: %w", id, err)
	}
	if st, err := task.Status(ctx); err != nil || st.Status != containerd.Running {
		return -1, fmt.Errorf("exec in container %s: %w", id, ErrNotRunning)
	}
	spec, err := cont.Spec(ctx)
	if err != nil {
		return -1, fmt.Errorf("exec in container %s: read spec: %w", id, err)
	}
	if spec.Process == nil {
		return -1, fmt.Errorf("exec in container %s: the container's spec has no process", id)
	}
	// A copy of the container's process: only the arguments and the
	// terminal differ. User, capabilities, rlimits, NoNewPrivileges and
	// the security profiles stay as they are, so an exec holds nothing
	// the session's own process does not.
	proc := *spec.Process
	proc.Args = slices.Clone(opts.Args)
	proc.Terminal = opts.TTY
	proc.Env = slices.Clone(spec.Process.Env)
	proc.ConsoleSize = nil
	if opts.TTY && opts.Size.Cols > 0 && opts.Size.Rows > 0 {
		// The terminal has its size before the process starts: a
		// resize after the start could come after its first output.
		proc.ConsoleSize = &specs.Box{Width: uint(opts.Size.Cols), Height: uint(opts.Size.Rows)}
	}
	if opts.TTY && !slices.ContainsFunc(proc.Env, func(e string) bool { return strings.HasPrefix(e, "TERM=") }) {
		proc.Env = append(proc.Env, "TERM=xterm")
	}

	stdout, stderr := opts.Stdout, opts.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	execID := "exec-" + randomHex(6)
	var process containerd.Process
	var stdin io.Reader
	if opts.Stdin != nil {
		// The shim keeps the process's input open until told: at the
		// caller's EOF, close it, so that the process sees its input end.
		stdin = &stdinCloser{r: opts.Stdin, close: func() {
			if process != nil {
				_ = process.CloseIO(context.WithoutCancel(ctx), containerd.WithStdinCloser)
			}
		}}
	}
	ioOpts := []cio.Opt{cio.WithStreams(stdin, stdout, stderr)}
	if opts.TTY {
		ioOpts = append(ioOpts, cio.WithTerminal)
	}
	var started sync.WaitGroup
	started.Add(1)
	if s, ok := stdin.(*stdinCloser); ok {
		s.started = &started
	}
	process, err = task.Exec(ctx, execID, &proc, cio.NewCreator(ioOpts...))
	if err != nil {
		started.Done()
		return -1, fmt.Errorf("exec in container %s: %w", id, err)
	}
	// Delete even when ctx has ended: an exec process left behind would
	// keep its FIFOs and its entry in the shim.
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _ = process.Delete(dctx, containerd.WithProcessKill)
	}()
	statusC, err := process.Wait(ctx)
	if err != nil {
		started.Done()
		return -1, fmt.Errorf("exec in container %s: wait: %w", id, err)
	}
	if err := process.Start(ctx); err != nil {
		started.Done()
		return -1, fmt.Errorf("exec in container %s: start %q: %w", id, opts.Args[0], err)
	}
	started.Done()
	if opts.TTY {
		if opts.Size.Cols > 0 && opts.Size.Rows > 0 {
			_ = process.Resize(ctx, uint32(opts.Size.Cols), uint32(opts.Size.Rows))
		}
		if opts.Resize != nil {
			rctx, stop := context.WithCancel(ctx)
			defer stop()
			go func() {
				for {
					select {
					case <-rctx.Done():
						return
					case sz, ok := <-opts.Resize:
						if !ok {
							return
						}
						if sz.Cols > 0 && sz.Rows > 0 {
							_ = process.Resize(rctx, uint32(sz.Cols), uint32(sz.Rows))
						}
					}
				}
			}()
		}
	}
	select {
	case st := <-statusC:
		code, _, err := st.Result()
		if err != nil {
			return -1, fmt.Errorf("exec in container %s: %w", id, err)
		}
		// Everything the process wrote is copied before its exit is
		// reported: its output is whole. A child it left running in the
		// background may hold its output open: then the caller going away
		// ends the wait.
		copied := make(chan struct{})
		go func() { process.IO().Wait(); close(copied) }()
		select {
		case <-copied:
		case <-ctx.Done():
			process.IO().Cancel()
			_ = process.IO().Close()
		}
		return int(code), nil
	case <-ctx.Done():
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = process.Kill(kctx, 9)
		return -1, fmt.Errorf("exec in container %s: %w", id, ctx.Err())
	}
}

// stdinCloser reads r and, at its end, closes the process's input.
type stdinCloser struct {
	r       io.Reader
	close   func()
	started *sync.WaitGroup
	once    sync.Once
}

func (s *stdinCloser) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err == io.EOF {
		s.once.Do(func() {
			// The process must exist (and have started) before its
			// input can be closed.
			if s.started != nil {
				s.started.Wait()
			}
			s.close()
		})
	}
	return n, err
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
