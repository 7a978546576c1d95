package runtime_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestContainerdExec runs processes in a running container: its exit code,
// its input and output, a terminal that follows resizes, and the same
// user, cgroup and capabilities as the container's own process (nothing
// added); a stopped container refuses.
func TestContainerdExec(t *testing.T) {
	rt := runtimetest.New(t, runtime.ContainerdOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	uid, gid := uint32(4242), uint32(4343)
	if err := rt.Start(ctx, runtime.Spec{ID: "exec", Image: runtimetest.ImageRef, UID: &uid, GID: &gid,
		Args: []string{"sleep", "600"}, MemoryBytes: 256 << 20}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Remove(context.Background(), "exec") })

	exec := func(t *testing.T, o runtime.ExecOptions) (int, string, string) {
		t.Helper()
		var out, errb syncBuffer
		o.Stdout, o.Stderr = &out, &errb
		code, err := rt.Exec(ctx, "exec", o)
		if err != nil {
			t.Fatalf("exec %q: %v", o.Args, err)
		}
		return code, out.String(), errb.String()
	}

	t.Run("exit code and streams", func(t *testing.T) {
		code, out, errs := exec(t, runtime.ExecOptions{Args: []string{"sh", "-c", "echo out; echo err >&2; exit 7"}})
		if code != 7 || out != "out\n" || errs != "err\n" {
			t.Errorf("exec = %d, stdout %q, stderr %q; want 7, out, err", code, out, errs)
		}
	})
	t.Run("stdin to EOF", func(t *testing.T) {
		code, out, _ := exec(t, runtime.ExecOptions{Args: []string{"wc", "-c"}, Stdin: strings.NewReader("twelve bytes")})
		if code != 0 || strings.TrimSpace(out) != "12" {
			t.Errorf("wc -c = %d %q, want 0 12", code, out)
		}
	})
	t.Run("same user, cgroup and capabilities as the container", func(t *testing.T) {
		_, out, _ := exec(t, runtime.ExecOptions{Args: []string{"sh", "-c",
			`id -u; id -g; cat /proc/self/cgroup | md5sum; cat /proc/1/cgroup | md5sum; grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status | md5sum; grep -E '^Cap(Eff|Prm|Bnd)' /proc/1/status | md5sum; grep CapEff /proc/self/status`}})
		l := strings.Split(strings.TrimSpace(out), "\n")
		if len(l) != 7 {
			t.Fatalf("output %q", out)
		}
		if l[0] != "4242" || l[1] != "4343" {
			t.Errorf("exec runs as %s:%s, want the container's 4242:4343", l[0], l[1])
		}
		if l[2] != l[3] {
			t.Errorf("exec's cgroup differs from the container's: its limits would not apply")
		}
		if l[4] != l[5] {
			t.Errorf("exec's capabilities differ from the container's process's")
		}
		if !strings.HasSuffix(l[6], "0000000000000000") {
			t.Errorf("exec has effective capabilities: %s", l[6])
		}
	})
	t.Run("terminal with resize", func(t *testing.T) {
		// Debian's busybox has no working stty size: ls -C lays out its
		// columns by the terminal's width, and the shell traps SIGWINCH.
		inR, inW := io.Pipe()
		resize := make(chan runtime.TermSize, 1)
		var out syncBuffer
		done := make(chan error, 1)
		var code int
		script := `mkdir -p /tmp/cols && cd /tmp/cols && for i in $(seq 10 49); do touch f$i; done
trap 'echo winch' WINCH
echo "cols $(ls -C | head -1 | wc -w)"; read x; echo "cols $(ls -C | head -1 | wc -w)"; test -t 0 && echo tty; exit 3`
		go func() {
			var err error
			code, err = rt.Exec(ctx, "exec", runtime.ExecOptions{Args: []string{"sh", "-c", script},
				TTY: true, Stdin: inR, Stdout: &out, Size: runtime.TermSize{Cols: 20, Rows: 24}, Resize: resize})
			done <- err
		}()
		waitOutput(t, &out, "cols ")
		resize <- runtime.TermSize{Cols: 200, Rows: 50}
		waitOutput(t, &out, "winch")
		if _, err := inW.Write([]byte("\n")); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		_ = inW.Close()
		o := strings.ReplaceAll(out.String(), "\r", "")
		// The terminal echoes the line typed: take the numbers as they come.
		var before, after int
		if m := regexp.MustCompile(`cols (\d+)\n(?s:.*)cols (\d+)\n`).FindStringSubmatch(o); m != nil {
			before, _ = strconv.Atoi(m[1])
			after, _ = strconv.Atoi(m[2])
		}
		if code != 3 || before < 1 || after <= before || !strings.Contains(o, "winch\n") || !strings.Contains(o, "tty\n") {
			t.Errorf("tty exec = %d, output %q; want 3, more names a line at 200 columns than at 20, on a tty", code, o)
		}
	})
	t.Run("not running", func(t *testing.T) {
		if err := rt.Start(ctx, runtime.Spec{ID: "exec-done", Image: runtimetest.ImageRef, Args: []string{"true"}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rt.Remove(context.Background(), "exec-done") })
		if _, err := rt.Wait(ctx, "exec-done"); err != nil {
			t.Fatal(err)
		}
		if _, err := rt.Exec(ctx, "exec-done", runtime.ExecOptions{Args: []string{"true"}}); !errors.Is(err, runtime.ErrNotRunning) {
			t.Errorf("exec in an exited container: %v, want ErrNotRunning", err)
		}
		if _, err := rt.Exec(ctx, "no-such", runtime.ExecOptions{Args: []string{"true"}}); !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("exec in no container: %v, want ErrNotFound", err)
		}
	})
}

func waitOutput(t *testing.T, b *syncBuffer, s string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(b.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in output %q within 30s", s, b.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
