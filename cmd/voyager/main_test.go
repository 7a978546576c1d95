package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	vrt "github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
)

// Values stamped into the test binary, checked by TestVersionE2E.
const (
	testVersion = "v0.0.0-test"
	testCommit  = "abc1234"
)

// binary is the voyager binary built by TestMain; empty under -short, where
// the tests that run it skip.
var binary string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	runtimetest.SweepLeftovers()
	dir, err := os.MkdirTemp("", "voyager-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "create temp dir:", err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		binary = filepath.Join(dir, "voyager")
		args := []string{"build", "-buildvcs=false", "-o", binary,
			"-ldflags", fmt.Sprintf(`-X main.version=%s -X main.commit=%s -extldflags "-Wl,-z,lazy"`, testVersion, testCommit)}
		if raceEnabled {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, ".")...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build voyager:", err)
			return 1
		}
		return m.Run()
	}()
	runtimetest.SweepOwn() // what its voyager processes left: agents' CDI specs, networks, containers
	os.Exit(code)
}

func needBinary(t *testing.T) {
	t.Helper()
	if binary == "" {
		t.Skip("runs the voyager binary; skipped with -short")
	}
}

// devEnv is the environment of a test `voyager dev`: a private home and
// data dir and free loopback ports, nothing inherited from the test.
type devEnv struct {
	home, clientAddr, peerAddr, httpAddr string
	// network names the agent's session network, removed when the test
	// ends (after the dev it runs stops): tests leave no bridges, firewall
	// chains or NAT rules behind.
	network string
}

// devNetworks numbers the session networks of this test binary.
var devNetworks atomic.Int64

func newDevEnv(t *testing.T) devEnv {
	return devEnv{home: t.TempDir(), clientAddr: etcdtest.FreeAddr(t), peerAddr: etcdtest.FreeAddr(t), httpAddr: etcdtest.FreeAddr(t), network: sessionNetwork(t)}
}

// sessionNetwork names a session network for an agent the test runs
// (VOYAGER_AGENT_NETWORK_NAME) and removes it when the test ends, after
// the agent stopped: tests leave no bridges, firewall chains or NAT rules
// behind.
func sessionNetwork(t *testing.T) string {
	name := fmt.Sprintf("cmdtest-%d-%d", os.Getpid(), devNetworks.Add(1))
	if os.Geteuid() == 0 {
		t.Cleanup(func() {
			_ = vrt.RemoveNetwork(context.Background(), vrt.NetworkOptions{Mode: vrt.NetworkIsolated, Name: name}, slog.New(slog.DiscardHandler))
		})
	}
	return name
}

func (e devEnv) environ() []string {
	return []string{
		"HOME=" + e.home,
		"XDG_DATA_HOME=" + filepath.Join(e.home, "xdg"),
		"VOYAGER_ETCD_CLIENT_ADDR=" + e.clientAddr,
		"VOYAGER_ETCD_PEER_ADDR=" + e.peerAddr,
		"VOYAGER_HTTP_ADDR=" + e.httpAddr,
		"VOYAGER_AGENT_NETWORK_NAME=" + e.network,
		"VOYAGER_LOG_LEVEL=debug", // the tests wait for routine events
	}
}

func (e devEnv) dataDir() string { return filepath.Join(e.home, "xdg", "voyager") }

// proc is a running voyager process whose stderr is read line by line.
type proc struct {
	t     *testing.T
	cmd   *exec.Cmd
	lines chan string   // stderr lines, in order; closed at EOF
	exit  chan struct{} // closed once the process has exited
	mu    sync.Mutex
	log   []string // every stderr line so far
}

func start(t *testing.T, environ []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = environ
	return startCmd(t, cmd, strings.Join(args, " "))
}

// startCmd starts cmd (a voyager process, perhaps behind a wrapper such as
// `ip netns exec`) and reads its stderr like start; name labels its log.
func startCmd(t *testing.T, cmd *exec.Cmd, name string) *proc {
	t.Helper()
	// The process records what it makes on the host under this test
	// binary's label, so that the binary's sweep at its end removes it
	// (runtimetest.SweepOwn), whatever environment the test gave it.
	if l := os.Getenv(vrt.EnvHostOwner); l != "" && cmd.Env != nil {
		cmd.Env = append(cmd.Env, vrt.EnvHostOwner+"="+l)
	}
	p := &proc{t: t, cmd: cmd, lines: make(chan string, 1024), exit: make(chan struct{})}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatalf("stderr pipe: %v", err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start voyager: %v", err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.log = append(p.log, sc.Text())
			p.mu.Unlock()
			p.lines <- sc.Text()
		}
		close(p.lines)
		_ = p.cmd.Wait() // after the last read, as exec requires
		close(p.exit)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exit:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exit
		}
		if t.Failed() {
			t.Logf("voyager %s stderr:\n%s", name, p.stderr())
		}
	})
	return p
}

func (p *proc) stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.log, "\n")
}

// waitFor reads stderr until a line containing s, and returns it. It fails
// the test at the deadline or if stderr ends first.
func (p *proc) waitFor(s string, within time.Duration) string {
	p.t.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				p.t.Fatalf("voyager exited before logging %q", s)
			}
			if strings.Contains(line, s) {
				return line
			}
		case <-deadline.C:
			p.t.Fatalf("no %q logged within %s", s, within)
		}
	}
}

// waitExit waits for the process to exit and returns its exit code.
func (p *proc) waitExit(within time.Duration) int {
	p.t.Helper()
	select {
	case <-p.exit:
	case <-time.After(within):
		p.t.Fatalf("voyager did not exit within %s", within)
	}
	for range p.lines { // drain what is left
	}
	return p.cmd.ProcessState.ExitCode()
}

func (p *proc) stop() int {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatalf("send SIGTERM: %v", err)
	}
	return p.waitExit(15 * time.Second)
}

func etcdClient(t *testing.T, addr string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{"http://" + addr},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

// TestDevE2E starts `voyager dev` with nothing but its environment, uses its
// etcd and HTTP server, stops it with SIGTERM, and starts it again over the
// same data dir.
func TestDevE2E(t *testing.T) {
	needBinary(t)
	env := newDevEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()

	// First run: a fresh data dir.
	p := start(t, env.environ(), "dev")
	etcdLine := p.waitFor(`msg="etcd listening"`, 30*time.Second)
	if !strings.Contains(etcdLine, "reused=false") || !strings.Contains(etcdLine, "endpoint=http://"+env.clientAddr) {
		t.Errorf("first etcd line = %q, want reused=false and endpoint http://%s", etcdLine, env.clientAddr)
	}
	if want := "data_dir=" + filepath.Join(env.dataDir(), "etcd"); !strings.Contains(etcdLine, want) {
		t.Errorf("etcd line = %q, want %s", etcdLine, want)
	}
	if line := p.waitFor(`msg="http listening"`, 5*time.Second); !strings.Contains(line, "addr="+env.httpAddr) {
		t.Errorf("http line = %q, want addr=%s", line, env.httpAddr)
	}
	p.waitFor(`msg="voyager dev ready"`, 5*time.Second)
	if line := p.waitFor(`msg="retention sweeper elected"`, 30*time.Second); !strings.Contains(line, filepath.Join(env.dataDir(), "history", "sessions.jsonl")) {
		t.Errorf("retention line = %q, want the history file in the data dir", line)
	}

	fi, err := os.Stat(env.dataDir())
	if err != nil {
		t.Fatalf("stat data dir: %v", err)
	}
	if perm := fi.Mode().Perm(); perm != 0o700 {
		t.Errorf("data dir mode = %v, want 0700", perm)
	}

	cli := etcdClient(t, env.clientAddr)
	if _, err := cli.Put(ctx, "/voyager/test/kept", "v1"); err != nil {
		t.Fatalf("put: %v", err)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := httpGet(t, "http://"+env.httpAddr+path); code != http.StatusOK {
			t.Errorf("GET %s = %d %q, want 200", path, code, body)
		}
	}
	if code, body := httpGet(t, "http://"+env.httpAddr+"/metrics"); code != http.StatusOK || !strings.Contains(body, "go_goroutines") || !strings.Contains(body, "voyager_placer_passes_total") ||
		!strings.Contains(body, `voyager_etcd_alarm{alarm="NOSPACE"} 0`) || !strings.Contains(body, "voyager_retention_sessions_unaccounted_total 0") {
		t.Errorf("GET /metrics = %d, has go_goroutines: %v, has the placer's counters: %v, has etcd's alarms: %v, has retention's: %v", code,
			strings.Contains(body, "go_goroutines"), strings.Contains(body, "voyager_placer_passes_total"), strings.Contains(body, "voyager_etcd_alarm"),
			strings.Contains(body, "voyager_retention_sessions_unaccounted_total"))
	}
	// The placer runs inside dev: a queued session gets its reason.
	sessionWaitsForNodes(t, ctx, cli)
	if code := p.stop(); code != 0 {
		t.Fatalf("first run exit code = %d, want 0", code)
	}
	if !strings.Contains(p.stderr(), `msg=stopped`) {
		t.Errorf("first run did not log stopped")
	}

	// Second run: the same data dir, the key is still there.
	p = start(t, env.environ(), "dev")
	if line := p.waitFor(`msg="etcd listening"`, 30*time.Second); !strings.Contains(line, "reused=true") {
		t.Errorf("second etcd line = %q, want reused=true", line)
	}
	p.waitFor(`msg="voyager dev ready"`, 5*time.Second)
	cli = etcdClient(t, env.clientAddr)
	resp, err := cli.Get(ctx, "/voyager/test/kept")
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v1" {
		t.Errorf("after restart /voyager/test/kept = %v, want v1", resp.Kvs)
	}
	if code := p.stop(); code != 0 {
		t.Fatalf("second run exit code = %d, want 0", code)
	}
	if !strings.Contains(p.stderr(), `msg=stopped`) {
		t.Errorf("second run did not log stopped")
	}
}

// TestDevBusyPortE2E: each listener's busy port is an error that names the
// address and the variable that moves it, and a non-zero exit.
func TestDevBusyPortE2E(t *testing.T) {
	needBinary(t)
	tests := []struct {
		name string
		env  string
		addr func(devEnv) string
	}{
		{"etcd client", "VOYAGER_ETCD_CLIENT_ADDR", func(e devEnv) string { return e.clientAddr }},
		{"etcd peer", "VOYAGER_ETCD_PEER_ADDR", func(e devEnv) string { return e.peerAddr }},
		{"http", "VOYAGER_HTTP_ADDR", func(e devEnv) string { return e.httpAddr }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newDevEnv(t)
			addr := tt.addr(env)
			l, err := net.Listen("tcp", addr)
			if err != nil {
				t.Fatalf("occupy %s: %v", addr, err)
			}
			defer l.Close()

			p := start(t, env.environ(), "dev")
			line := p.waitFor("address already in use", 30*time.Second)
			if code := p.waitExit(15 * time.Second); code == 0 {
				t.Errorf("exit code = 0, want non-zero")
			}
			if !strings.Contains(line, addr) || !strings.Contains(line, tt.env) {
				t.Errorf("error line %q does not name %s and %s", line, addr, tt.env)
			}
		})
	}
}

// TestDevExternalEtcdE2E: with VOYAGER_ETCD_ENDPOINTS set, dev uses that
// etcd and starts no embedded one; an etcd that does not answer is an error
// naming the variable.
func TestDevExternalEtcdE2E(t *testing.T) {
	needBinary(t)
	t.Run("reachable", func(t *testing.T) {
		etcd := etcdtest.Start(t, etcdtest.Options{})
		env := newDevEnv(t)
		p := start(t, append(env.environ(), "VOYAGER_ETCD_ENDPOINTS="+etcd.Server.Endpoint()), "dev")
		if line := p.waitFor(`msg="etcd connected"`, 30*time.Second); !strings.Contains(line, etcd.Server.Endpoint()) {
			t.Errorf("etcd line = %q, want endpoints=%s", line, etcd.Server.Endpoint())
		}
		p.waitFor(`msg="voyager dev ready"`, 5*time.Second)
		if code, body := httpGet(t, "http://"+env.httpAddr+"/readyz"); code != http.StatusOK {
			t.Errorf("GET /readyz = %d %q, want 200", code, body)
		}
		if code := p.stop(); code != 0 {
			t.Errorf("exit code = %d, want 0", code)
		}
		// The data dir may hold the API's audit log; no embedded etcd's.
		if _, err := os.Stat(filepath.Join(env.dataDir(), "etcd")); !os.IsNotExist(err) {
			t.Errorf("an embedded etcd's data dir was created (stat: %v); an external etcd needs none", err)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		env := newDevEnv(t)
		p := start(t, append(env.environ(),
			"VOYAGER_ETCD_ENDPOINTS=http://"+etcdtest.FreeAddr(t),
			"VOYAGER_ETCD_DIAL_TIMEOUT=500ms"), "dev")
		line := p.waitFor(`voyager dev failed`, 30*time.Second)
		if !strings.Contains(line, "VOYAGER_ETCD_ENDPOINTS") {
			t.Errorf("error line %q does not name VOYAGER_ETCD_ENDPOINTS", line)
		}
		if code := p.waitExit(15 * time.Second); code == 0 {
			t.Errorf("exit code = 0, want non-zero")
		}
	})
}

func TestVersionE2E(t *testing.T) {
	needBinary(t)
	out, err := exec.Command(binary, "version").Output()
	if err != nil {
		t.Fatalf("voyager version: %v", err)
	}
	for _, want := range []string{testVersion, testCommit, runtime.Version()} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("voyager version output %q lacks %q", out, want)
		}
	}
}

// TestRun checks the dispatcher and every command's --help in process.
func TestRun(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		code       int
		stdout     []string // substrings wanted on stdout
		stderr     []string // substrings wanted on stderr
		dontStdout bool     // stdout must be empty
	}{
		{name: "no command", args: nil, code: 2, stderr: []string{"Usage:", "voyager [command]"}, dontStdout: true},
		{name: "unknown command", args: []string{"launch"}, code: 2, stderr: []string{`unknown command "launch"`, "voyager --help"}, dontStdout: true},
		{name: "help", args: []string{"help"}, code: 0, stdout: []string{"voyager [command]", "dev", "version", "help", "completion"}},
		{name: "--help", args: []string{"--help"}, code: 0, stdout: []string{"voyager [command]"}},
		{name: "-help", args: []string{"-help"}, code: 0, stdout: []string{"voyager [command]"}},
		{name: "help dev", args: []string{"help", "dev"}, code: 0, stdout: []string{"voyager dev [flags]", "--http-addr", "VOYAGER_HTTP_ADDR"}},
		{name: "help session create", args: []string{"help", "session", "create"}, code: 0, stdout: []string{"voyager session create [flags]", "--gpus"}},
		{name: "help unknown", args: []string{"help", "launch"}, code: 2, stderr: []string{`unknown command "launch"`}, dontStdout: true},
		{name: "dev --help", args: []string{"dev", "--help"}, code: 0, stdout: []string{
			"voyager dev [flags]",
			"--etcd-endpoints", "--etcd-prefix", "--etcd-dial-timeout", "--data-dir", "--etcd-client-addr", "--etcd-peer-addr", "--http-addr", "--log-level", "--log-format",
			"Environment (a flag given explicitly wins over its variable):",
			"VOYAGER_ETCD_ENDPOINTS", "VOYAGER_ETCD_PREFIX", "VOYAGER_ETCD_DIAL_TIMEOUT", "VOYAGER_DATA_DIR", "VOYAGER_ETCD_CLIENT_ADDR",
			"VOYAGER_ETCD_PEER_ADDR", "VOYAGER_HTTP_ADDR", "VOYAGER_LOG_LEVEL", "VOYAGER_LOG_FORMAT",
		}},
		{name: "check --help", args: []string{"check", "--help"}, code: 0, stdout: []string{
			"voyager check [flags]", "--start", "--end", "--follow", "VOYAGER_ETCD_ENDPOINTS", "state machine",
		}},
		{name: "dev bad flag", args: []string{"dev", "--nope"}, code: 2, stderr: []string{"unknown flag: --nope", "voyager dev --help"}, dontStdout: true},
		{name: "dev bad single-dash flag", args: []string{"dev", "-nope"}, code: 2, stderr: []string{"unknown shorthand flag: 'n' in -nope"}, dontStdout: true},
		{name: "dev extra argument", args: []string{"dev", "now"}, code: 2, stderr: []string{`unknown command "now" for "voyager dev"`}},
		{name: "dev invalid flag value", args: []string{"dev", "--log-level=loud"}, code: 2, stderr: []string{`invalid --log-level="loud" (flag for VOYAGER_LOG_LEVEL)`}},
		{name: "dev invalid single-dash flag value", args: []string{"dev", "-log-level", "loud"}, code: 2, stderr: []string{`invalid --log-level="loud" (flag for VOYAGER_LOG_LEVEL)`}},
		{name: "version --help", args: []string{"version", "--help"}, code: 0, stdout: []string{"voyager version", "Environment: none."}},
		{name: "--version", args: []string{"--version"}, code: 0, stdout: []string{"version: ", "commit: "}},
		{name: "help --help", args: []string{"help", "--help"}, code: 0, stdout: []string{"voyager help [command]"}},
		{name: "session without subcommand", args: []string{"session"}, code: 2, stderr: []string{"voyager session: want a subcommand", "create", "list"}, dontStdout: true},
		{name: "session get flag after argument", args: []string{"session", "get", "s-1", "-o", "yaml", "--token", ""}, code: 2,
			stderr: []string{"voyager session get: no API token"}},
		{name: "session get bad output", args: []string{"session", "get", "s-1", "-o", "xml", "--token", "t"}, code: 2,
			stderr: []string{`invalid -o "xml": want one of table, wide, json, yaml`}},
		{name: "session get two arguments", args: []string{"session", "get", "a", "b"}, code: 2, stderr: []string{"want 1 argument(s) (ID), got 2"}},
		{name: "session create --help", args: []string{"session", "create", "--help"}, code: 0, stdout: []string{"--gpus", "--image", "-o, --output", "VOYAGER_URL", "VOYAGER_TOKEN"}},
		{name: "session list --help", args: []string{"session", "list", "-h"}, code: 0, stdout: []string{"-w, --watch", "--watch-interval", "-o, --output"}},
		{name: "run without command", args: []string{"run", "--token", "t", "-image", "x"}, code: 2, stderr: []string{"want a command after --"}},
		{name: "completion bash", args: []string{"completion", "bash"}, code: 0, stdout: []string{"# bash completion V2 for voyager", "__start_voyager"}},
		{name: "completion zsh", args: []string{"completion", "zsh"}, code: 0, stdout: []string{"#compdef voyager", "_voyager"}},
		{name: "completion fish", args: []string{"completion", "fish"}, code: 0, stdout: []string{"complete -c voyager"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), tt.args, &stdout, &stderr)
			if code != tt.code {
				t.Errorf("exit code = %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.code, &stdout, &stderr)
			}
			for _, s := range tt.stdout {
				if !strings.Contains(stdout.String(), s) {
					t.Errorf("stdout lacks %q:\n%s", s, &stdout)
				}
			}
			for _, s := range tt.stderr {
				if !strings.Contains(stderr.String(), s) {
					t.Errorf("stderr lacks %q:\n%s", s, &stderr)
				}
			}
			if tt.dontStdout && stdout.Len() > 0 {
				t.Errorf("stdout = %q, want empty", &stdout)
			}
		})
	}
}
