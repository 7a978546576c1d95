package nodeagent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// MPS runs one CUDA MPS control daemon per shared GPU (state.GPU.Shared)
// while a session holds a fraction of it: nvidia-cuda-mps-control -d with
// CUDA_VISIBLE_DEVICES set to the GPU's UUID and its pipe and log
// directories under Dir/<GPU UUID>/ (pipe, log). A session's container
// gets the pipe directory and its limits in its environment (share.go).
// Daemons outlive the agent (the agent adopts them again from the pid file
// the daemon writes into its pipe directory, as it adopts containers) and
// are stopped (quit on the control's stdin, then SIGKILL) once no binding
// holds a fraction of their GPU (Keep). Safe for concurrent use.
type MPS struct {
	// Binary is the control program: nvidia-cuda-mps-control, or a
	// stand-in speaking the same protocol in tests.
	Binary string
	// Dir holds a directory per GPU.
	Dir string
	// StopGrace is how long a daemon told to quit has before SIGKILL.
	StopGrace time.Duration
	log       *slog.Logger

	mu      sync.Mutex
	running map[string]int // GPU UUID → control daemon pid
}

// mpsPidFile is the file the control daemon writes its pid into, in its
// pipe directory (NVIDIA's MPS documentation, "Tools and Interface").
const mpsPidFile = "nvidia-cuda-mps-control.pid"

// NewMPS returns a manager of control daemons started from binary, with
// their directories under dir.
func NewMPS(binary, dir string, log *slog.Logger) *MPS {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &MPS{Binary: binary, Dir: dir, StopGrace: 10 * time.Second, log: log, running: map[string]int{}}
}

// PipeDir is the pipe directory of gpu's daemon: what a client's
// CUDA_MPS_PIPE_DIRECTORY names (mounted into its container).
func (m *MPS) PipeDir(gpu string) string { return filepath.Join(m.Dir, gpu, "pipe") }

// LogDir is the log directory of gpu's daemon.
func (m *MPS) LogDir(gpu string) string { return filepath.Join(m.Dir, gpu, "log") }

func (m *MPS) env(gpu string) []string {
	return append(os.Environ(), "CUDA_VISIBLE_DEVICES="+gpu, "CUDA_MPS_PIPE_DIRECTORY="+m.PipeDir(gpu), "CUDA_MPS_LOG_DIRECTORY="+m.LogDir(gpu))
}

// alive reports whether process pid exists.
func alive(pid int) bool {
	return pid > 0 && syscall.Kill(pid, 0) == nil
}

// readPid reads the pid gpu's daemon wrote; 0 if none is there or it is
// not running.
func (m *MPS) readPid(gpu string) int {
	b, err := os.ReadFile(filepath.Join(m.PipeDir(gpu), mpsPidFile))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || !alive(pid) {
		return 0
	}
	return pid
}

// Ensure makes gpu's control daemon run, starting it if it does not (one
// this agent or an earlier one started is adopted), and returns its pipe
// directory. It waits for the daemon's pid file, up to ctx's deadline.
func (m *MPS) Ensure(ctx context.Context, gpu string) (string, error) {
	if strings.ContainsAny(gpu, "/\x00") || gpu == "" || gpu == "." || gpu == ".." {
		return "", fmt.Errorf("start MPS daemon: %q is no GPU UUID", gpu)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if pid := m.running[gpu]; alive(pid) {
		return m.PipeDir(gpu), nil
	}
	if pid := m.readPid(gpu); pid > 0 {
		m.running[gpu] = pid
		m.log.Debug("adopted an MPS control daemon", "gpu", gpu, "pid", pid)
		return m.PipeDir(gpu), nil
	}
	for _, d := range []string{m.PipeDir(gpu), m.LogDir(gpu)} {
		// The pipe directory is reached by the sessions' own users.
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", fmt.Errorf("start MPS daemon of %s: %w", gpu, err)
		}
	}
	_ = os.Remove(filepath.Join(m.PipeDir(gpu), mpsPidFile)) // a dead daemon's
	cmd := exec.CommandContext(ctx, m.Binary, "-d")
	cmd.Env = m.env(gpu)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// -d forks the daemon and returns: it must not share our process
	// group (a signal to the agent's group must not end it).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("start MPS daemon of %s (%s -d, %s): %w: %s", gpu, m.Binary, "VOYAGER_AGENT_MPS_CONTROL", err, strings.TrimSpace(out.String()))
	}
	for {
		if pid := m.readPid(gpu); pid > 0 {
			m.running[gpu] = pid
			m.log.Info("started an MPS control daemon", "gpu", gpu, "pid", pid, "pipe", m.PipeDir(gpu))
			return m.PipeDir(gpu), nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("start MPS daemon of %s: no live pid in %s: %w", gpu, filepath.Join(m.PipeDir(gpu), mpsPidFile), ctx.Err())
		case <-time.After(50 * time.Millisecond): // polling the daemon's pid file, bounded by ctx
		}
	}
}

// Stop ends gpu's control daemon: quit on the control's stdin, then
// SIGKILL once StopGrace passed. Stopping a GPU with no daemon does
// nothing.
func (m *MPS) Stop(ctx context.Context, gpu string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stop(ctx, gpu)
}

func (m *MPS) stop(ctx context.Context, gpu string) error {
	pid := m.running[gpu]
	if !alive(pid) {
		pid = m.readPid(gpu)
	}
	delete(m.running, gpu)
	if pid == 0 {
		return nil
	}
	qctx, cancel := context.WithTimeout(ctx, m.StopGrace)
	defer cancel()
	cmd := exec.CommandContext(qctx, m.Binary)
	cmd.Env = m.env(gpu)
	cmd.Stdin = strings.NewReader("quit\n")
	qerr := cmd.Run()
	for alive(pid) {
		if qctx.Err() != nil {
			m.log.Warn("MPS control daemon did not quit; killing it", "gpu", gpu, "pid", pid, "quitErr", qerr)
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("stop MPS daemon of %s: kill %d: %w", gpu, pid, err)
			}
			break
		}
		time.Sleep(20 * time.Millisecond) // polling the daemon's exit, bounded by StopGrace
	}
	_ = os.Remove(filepath.Join(m.PipeDir(gpu), mpsPidFile))
	m.log.Info("stopped an MPS control daemon", "gpu", gpu, "pid", pid)
	return nil
}

// Keep stops every daemon whose GPU is not in gpus (those a binding of
// this node holds a fraction of), including those an earlier agent left:
// every GPU directory under Dir with a live daemon.
func (m *MPS) Keep(ctx context.Context, gpus map[string]bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	known := map[string]bool{}
	for g := range m.running {
		known[g] = true
	}
	if ents, err := os.ReadDir(m.Dir); err == nil {
		for _, e := range ents {
			if e.IsDir() {
				known[e.Name()] = true
			}
		}
	}
	var errs []error
	for g := range known {
		if !gpus[g] {
			errs = append(errs, m.stop(ctx, g))
		}
	}
	return errors.Join(errs...)
}

// Running lists, sorted, the GPUs whose daemon this manager knows runs.
func (m *MPS) Running() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for g, pid := range m.running {
		if alive(pid) {
			out = append(out, g)
		}
	}
	sort.Strings(out)
	return out
}
