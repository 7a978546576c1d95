package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/sys/unix"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/internal/audit"
)

// streamUser is one person using the CLI against a test dev.
type streamUser struct {
	t       *testing.T
	environ []string
	http    string
	token   string
}

func (u streamUser) run(args ...string) (int, string, string) {
	u.t.Helper()
	return runBinaryAs(u.t, u.environ, u.http, u.token, args...)
}

// startSession creates a batch session running command in the test image
// and waits until it runs; it returns its id.
func (u streamUser) startSession(command ...string) string {
	u.t.Helper()
	return u.createAndWait(nil, command)
}

// createAndWait creates a batch session running command in the test image
// and waits, with voyager session wait and its flags waitFlags (none:
// until it runs), for at most two minutes; it returns its id.
func (u streamUser) createAndWait(waitFlags, command []string) string {
	u.t.Helper()
	args := append([]string{"session", "create", "--kind", "batch", "--image", agentTestImage, "--cpu", "0.2", "--memory", "256", "-o", "name", "--"}, command...)
	code, out, stderr := u.run(args...)
	if code != 0 {
		u.t.Fatalf("session create: exit %d\n%s", code, stderr)
	}
	id := strings.TrimSpace(out)
	wait := append(append([]string{"session", "wait", "--timeout", "120s"}, waitFlags...), id)
	if code, out, stderr := u.run(wait...); code != 0 {
		u.t.Fatalf("session wait %s: exit %d\n%s%s", id, code, out, stderr)
	}
	return id
}

// dialAPI opens the WebSocket of an API stream route as token, and returns
// the HTTP status and problem of a refusal.
func dialAPI(t *testing.T, httpAddr, token, path string, q url.Values) (*websocket.Conn, int, string) {
	t.Helper()
	u := "ws://" + httpAddr + path + "?" + q.Encode()
	ws, resp, err := websocket.DefaultDialer.Dial(u, http.Header{"Authorization": {"Bearer " + token}})
	if err == nil {
		t.Cleanup(func() { _ = ws.Close() })
		return ws, http.StatusSwitchingProtocols, ""
	}
	if resp == nil {
		t.Fatalf("dial %s: %v", u, err)
	}
	defer resp.Body.Close()
	var p api.Problem
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &p)
	return nil, resp.StatusCode, p.Detail
}

// auditRecords reads the dev's exec audit log.
func auditRecords(t *testing.T, env devEnv) []api.ExecRecord {
	t.Helper()
	f, err := os.Open(filepath.Join(env.dataDir(), "audit", "exec.jsonl"))
	if err != nil {
		t.Fatalf("open the exec audit log: %v", err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("exec audit log mode %v, want 0600", fi.Mode().Perm())
	}
	var out []api.ExecRecord
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r api.ExecRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("audit line %q: %v", sc.Text(), err)
		}
		out = append(out, r)
	}
	return out
}

// TestSessionExecE2E is voyager session exec end to end with nothing faked:
// voyager dev with its real agent on a real containerd (each session in
// its own network namespace), the built CLI as three people. The owner
// runs commands without and with a terminal (exit codes, input, stderr,
// a resize of the terminal reaching the command), as the session's user
// in its cgroup; an admin may too; another user gets 404, whether through
// the CLI or straight at the API; an exec into a session that has ended is
// refused with 409; every exec is in the audit log.
func TestSessionExecE2E(t *testing.T) {
	needBinary(t)
	env, environ, dev := devWithAgent(t, "voyager-exec-e2e", "exec-e2e")
	ada := streamUser{t, environ, env.httpAddr, binaryToken(t, environ, "-sub", "ada")}
	bob := streamUser{t, environ, env.httpAddr, binaryToken(t, environ, "-sub", "bob")}
	root := streamUser{t, environ, env.httpAddr, binaryToken(t, environ, "-sub", "root", "-admin")}
	id := ada.startSession("sleep", "600")

	t.Run("without a terminal", func(t *testing.T) {
		code, out, stderr := ada.run("session", "exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
		if code != 7 || out != "out\n" || stderr != "err\n" {
			t.Errorf("exec: exit %d, stdout %q, stderr %q; want 7, out, err", code, out, stderr)
		}
		code, out, stderr = ada.run("session", "exec", id, "--", "sh", "-c",
			`test "$(id -u):$(id -g)" = "$(stat -c %u:%g /proc/1)" && cmp /proc/self/cgroup /proc/1/cgroup && grep ^CapEff /proc/self/status`)
		if code != 0 || !strings.HasSuffix(strings.TrimSpace(out), "0000000000000000") {
			t.Errorf("exec as the session's user, in its cgroup, without capabilities: exit %d, %q %s", code, out, stderr)
		}
		c := exec.Command(binary, "session", "exec", id, "-i", "--", "wc", "-c")
		c.Env = append(environ, envURL+"=http://"+env.httpAddr, envToken+"="+ada.token)
		c.Stdin = strings.NewReader("twelve bytes")
		if out, err := c.Output(); err != nil || strings.TrimSpace(string(out)) != "12" {
			t.Errorf("exec -i wc -c: %v, %q; want 12", err, out)
		}
		if code, _, stderr := ada.run("session", "exec", id, "--", "no-such-command"); code != exitNoCommand || !strings.Contains(stderr, "no such command") {
			t.Errorf("exec of a missing command: exit %d, %s; want 127 saying so", code, stderr)
		}
	})

	t.Run("terminal with resize", func(t *testing.T) {
		ptmx, pts := openPTY(t, 20, 24)
		script := `mkdir -p /tmp/cols && cd /tmp/cols && for i in $(seq 10 49); do touch f$i; done
trap 'echo winch' WINCH
echo "cols $(ls -C | head -1 | wc -w)"; read x; echo "cols $(ls -C | head -1 | wc -w)"; test -t 0 && echo tty; exit 3`
		c := exec.Command(binary, "session", "exec", id, "-it", "--", "sh", "-c", script)
		c.Env = append(environ, envURL+"=http://"+env.httpAddr, envToken+"="+ada.token)
		c.Stdin, c.Stdout, c.Stderr = pts, pts, pts
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		_ = pts.Close()
		var out syncBuf
		go func() { _, _ = io.Copy(&out, ptmx) }()
		out.waitFor(t, "cols ")
		// The terminal grows: the CLI hears SIGWINCH and tells the session.
		if err := unix.IoctlSetWinsize(int(ptmx.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Col: 200, Row: 50}); err != nil {
			t.Fatal(err)
		}
		out.waitFor(t, "winch")
		if _, err := ptmx.Write([]byte("\n")); err != nil {
			t.Fatal(err)
		}
		err := c.Wait()
		o := strings.ReplaceAll(out.String(), "\r", "")
		// The terminal echoes the line typed: take the numbers as they come.
		var before, after int
		if m := regexp.MustCompile(`cols (\d+)\n(?s:.*)cols (\d+)\n`).FindStringSubmatch(o); m != nil {
			before, _ = strconv.Atoi(m[1])
			after, _ = strconv.Atoi(m[2])
		}
		if c.ProcessState.ExitCode() != 3 || before < 1 || after <= before || !strings.Contains(o, "winch\n") || !strings.Contains(o, "tty\n") {
			t.Errorf("exec -it: %v, exit %d, output %q; want 3, more names a line after the terminal grew, on a tty", err, c.ProcessState.ExitCode(), o)
		}
	})

	t.Run("who may", func(t *testing.T) {
		if code, out, _ := root.run("session", "exec", id, "--", "echo", "admin"); code != 0 || out != "admin\n" {
			t.Errorf("an admin's exec: exit %d, %q", code, out)
		}
		if code, out, stderr := bob.run("session", "exec", id, "--", "echo", "pwned"); code != exitError || out != "" || !strings.Contains(stderr, "no session") {
			t.Errorf("another user's exec: exit %d, %q, %s; want 1 and no session", code, out, stderr)
		}
		q := url.Values{"cmd": {"echo", "pwned"}}
		if _, status, detail := dialAPI(t, env.httpAddr, bob.token, "/api/v1/sessions/"+id+"/exec", q); status != http.StatusNotFound {
			t.Errorf("another user's exec at the API: %d %s, want 404", status, detail)
		}
		if _, status, _ := dialAPI(t, env.httpAddr, "not-a-token", "/api/v1/sessions/"+id+"/exec", q); status != http.StatusUnauthorized {
			t.Errorf("exec without a valid token: %d, want 401", status)
		}
		svc := binaryToken(t, environ, "-sub", "hub", "-role", "service")
		if _, status, _ := dialAPI(t, env.httpAddr, svc, "/api/v1/sessions/"+id+"/exec", q); status != http.StatusForbidden {
			t.Errorf("a service token's exec: %d, want 403", status)
		}
	})

	t.Run("not running", func(t *testing.T) {
		done := ada.startSessionEnded("true")
		code, _, stderr := ada.run("session", "exec", done, "--", "true")
		if code != exitError || !strings.Contains(stderr, "Succeeded") {
			t.Errorf("exec into an ended session: exit %d, %s; want 1 saying it is Succeeded", code, stderr)
		}
		if _, status, _ := dialAPI(t, env.httpAddr, ada.token, "/api/v1/sessions/"+done+"/exec", url.Values{"cmd": {"true"}}); status != http.StatusConflict {
			t.Errorf("exec into an ended session at the API: %d, want 409", status)
		}
	})

	t.Run("audit log", func(t *testing.T) {
		recs := auditRecords(t, env)
		var starts, ends, admin int
		for _, r := range recs {
			if r.Session != id || r.Action != "exec" {
				continue
			}
			if r.Subject == "bob" {
				t.Errorf("bob's refused exec is in the audit log as run: %+v", r)
			}
			switch r.Event {
			case "start":
				starts++
			case "end":
				ends++
				if strings.Join(r.Command, " ") == "sh -c echo out; echo err >&2; exit 7" && (r.ExitCode == nil || *r.ExitCode != 7 || r.Subject != "ada") {
					t.Errorf("audit end of exit 7: %+v", r)
				}
			}
			if r.Admin && r.Subject == "root" && r.Owner == "ada" {
				admin++
			}
		}
		if starts < 6 || starts != ends || admin != 2 {
			t.Errorf("audit log: %d starts, %d ends, %d admin records; want every exec (6) started and ended, the admin's marked\n%+v", starts, ends, admin, recs)
		}
	})
	t.Run("API audit log", func(t *testing.T) {
		// Admins read execs where they read every other write: the API's
		// audit log (voyager audit), as session.exec.start and .end.
		b, err := os.ReadFile(filepath.Join(env.dataDir(), "audit", "api.jsonl"))
		if err != nil {
			t.Fatalf("read the API's audit log: %v", err)
		}
		var starts, ends int
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var r audit.Record
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatalf("audit line %q: %v", line, err)
			}
			if r.Target != id {
				continue
			}
			switch r.Action {
			case "session.exec.start":
				starts++
			case "session.exec.end":
				ends++
				var cmd []string
				_ = json.Unmarshal([]byte(r.Fields["command"]), &cmd)
				if strings.Join(cmd, " ") == "sh -c echo out; echo err >&2; exit 7" && r.Fields["exitCode"] != "7" {
					t.Errorf("API audit end of exit 7: %+v", r)
				}
			}
		}
		if starts < 6 || starts != ends {
			t.Errorf("API audit log: %d exec starts, %d ends for %s; want every exec (6) started and ended", starts, ends, id)
		}
	})
	if code := dev.stop(); code != 0 {
		t.Errorf("dev exit code %d", code)
	}
}

// startSessionEnded creates a batch session running command and waits
// for it to end.
func (u streamUser) startSessionEnded(command ...string) string {
	u.t.Helper()
	return u.createAndWait([]string{"--for", "end"}, command)
}

// openPTY opens a pseudo-terminal of cols×rows: its master and its slave.
func openPTY(t *testing.T, cols, rows uint16) (*os.File, *os.File) {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open /dev/ptmx: %v", err)
	}
	t.Cleanup(func() { _ = ptmx.Close() })
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock pty: %v", err)
	}
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	pts, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open pty slave: %v", err)
	}
	t.Cleanup(func() { _ = pts.Close() })
	if err := unix.IoctlSetWinsize(int(pts.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: rows}); err != nil {
		t.Fatalf("size pty: %v", err)
	}
	return ptmx, pts
}

// syncBuf is a buffer a copier writes while the test reads.
type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuf) waitFor(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(s.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q within 60s in %q", want, s.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
