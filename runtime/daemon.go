package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd"
)

// Daemon is a private containerd this process started: its root, state,
// socket and log all under one directory, its CRI plugin off. Containers
// outlive it (their shims keep them running), and a Daemon started again
// over the same directory finds them.
type Daemon struct {
	// Address is the daemon's socket.
	Address string
	// Dir holds everything of the daemon.
	Dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// ErrNoContainerd means the containerd binary is not installed.
var ErrNoContainerd = errors.New("containerd is not installed (apt-get install containerd runc)")

// StartContainerd starts containerd over dir and waits until it answers
// (at most 30s). It needs root.
func StartContainerd(ctx context.Context, dir string) (*Daemon, error) {
	bin, err := exec.LookPath("containerd")
	if err != nil {
		return nil, fmt.Errorf("start containerd: %w", ErrNoContainerd)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("start containerd: it must run as root")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	addr := filepath.Join(dir, "containerd.sock")
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
[ttrpc]
  address = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), addr, addr+".ttrpc")
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	logPath := filepath.Join(dir, "containerd.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	defer logf.Close()
	_ = os.Remove(addr) // a socket left by a daemon that was killed
	cmd := exec.Command(bin, "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Die with the process that started it, so that a killed test or dev
	// leaves no daemon behind (containers survive in their shims).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
	d := &Daemon{Address: addr, Dir: dir, cmd: cmd, done: make(chan struct{})}
	// The death signal comes when the thread that forked the daemon ends,
	// not the process: the Go runtime ends a thread whose goroutine exits
	// locked to it (a network namespace switch that could not switch
	// back), which stopped the test suite's containerd in the middle of a
	// run. So the daemon is forked from a goroutine locked to its own
	// thread, which lives until the daemon has exited.
	started := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(d.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(addr); err == nil {
			cli, err := containerd.New(addr, containerd.WithTimeout(2*time.Second))
			if err == nil {
				_, err = cli.Version(ctx)
				_ = cli.Close()
				if err == nil {
					return d, nil
				}
			}
		}
		select {
		case <-d.done:
			return nil, fmt.Errorf("start containerd: it exited; its log (%s):\n%s", logPath, logTail(logPath))
		case <-ctx.Done():
			_ = d.Stop(5 * time.Second)
			return nil, fmt.Errorf("start containerd: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond): // polling for the socket, bounded by deadline
		}
		if time.Now().After(deadline) {
			_ = d.Stop(5 * time.Second)
			return nil, fmt.Errorf("start containerd: no answer on %s after 30s; its log (%s):\n%s", addr, logPath, logTail(logPath))
		}
	}
}

// Stop ends the daemon: SIGTERM, then SIGKILL after timeout.
func (d *Daemon) Stop(timeout time.Duration) error {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
		return nil
	case <-time.After(timeout):
		_ = d.cmd.Process.Kill()
		<-d.done
		return fmt.Errorf("stop containerd: killed after %v", timeout)
	}
}

func logTail(path string) []byte {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return bytes.TrimSpace(b)
}

// PID is the daemon's process id (tests pause it to hang every call).
func (d *Daemon) PID() int { return d.cmd.Process.Pid }
