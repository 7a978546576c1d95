package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/voyager-gpu/voyager/internal/testreq"
)

// External is an etcd server in its own process: Debian's etcd-server
// (/usr/bin/etcd, 3.4). Heavy tests use it so that, under the race
// detector, only the code under test is instrumented and not etcd itself;
// it also keeps Voyager honest against an older server than the one it
// embeds.
type External struct {
	Endpoint string
	cmd      *exec.Cmd
	cpu      struct { // CPU's open thread files
		sync.Mutex
		files  map[int]*os.File
		last   map[int]time.Duration // each thread's last reading
		listed time.Time
	}
}

// ExternalOptions adjust an external test server.
type ExternalOptions struct {
	// Fsync keeps etcd's fsync of its log and database on (a real data
	// directory on disk, as in production). Tests default to fsync off
	// for speed; benchmarks that report latency a user would see turn it
	// on.
	Fsync bool
	// CPUs, when set, runs etcd on those CPUs only (taskset's list, as
	// "0" or "0-1"): a benchmark gives etcd cores of its own, as a
	// deployment gives it machines of its own.
	CPUs string
}

// StartExternal starts Debian's etcd on free loopback ports with a fresh
// data directory and fsync off, waits until it answers, and stops it at
// cleanup. It fails the test (with how to install it) if the binary is
// missing.
func StartExternal(tb testing.TB) *External {
	tb.Helper()
	return StartExternalWith(tb, ExternalOptions{})
}

// StartExternalWith is StartExternal with options.
func StartExternalWith(tb testing.TB, opts ExternalOptions) *External {
	tb.Helper()
	path := etcdBinary(tb)
	client, peer := FreeAddr(tb), FreeAddr(tb)
	dir := tb.TempDir()
	args := []string{
		"--name", "test",
		"--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", "http://" + client,
		"--advertise-client-urls", "http://" + client,
		"--listen-peer-urls", "http://" + peer,
		"--initial-advertise-peer-urls", "http://" + peer,
		"--initial-cluster", "test=http://" + peer,
		"--log-level", "error",
	}
	e := runWith(tb, opts, "http://"+client, path, dir, args...)
	waitAnswers(tb, e.Client(tb), dir)
	return e
}

// runWith starts etcd at path with args and what opts add (fsync off
// unless opts.Fsync; taskset to opts.CPUs), serving endpoint, and returns
// its process, whose CPU readers are closed at cleanup.
func runWith(tb testing.TB, opts ExternalOptions, endpoint, path, dir string, args ...string) *External {
	tb.Helper()
	if !opts.Fsync {
		args = append(args, "--unsafe-no-fsync")
	}
	if opts.CPUs != "" {
		taskset, err := exec.LookPath("taskset")
		if err != nil {
			testreq.Missing(tb, "util-linux", fmt.Sprintf("taskset not found (%v): install Debian's util-linux", err))
		}
		args = append([]string{"-c", opts.CPUs, path}, args...)
		path = taskset
	}
	e := &External{Endpoint: endpoint, cmd: runEtcd(tb, path, dir, args...)}
	tb.Cleanup(func() {
		e.cpu.Lock()
		defer e.cpu.Unlock()
		for _, f := range e.cpu.files {
			_ = f.Close()
		}
	})
	return e
}

// etcdBinary finds Debian's etcd (or VOYAGER_TEST_ETCD), or stops tb
// saying how to install it.
func etcdBinary(tb testing.TB) string {
	tb.Helper()
	bin := os.Getenv("VOYAGER_TEST_ETCD")
	if bin == "" {
		bin = "etcd"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		testreq.Missing(tb, "etcd-server", fmt.Sprintf("etcd server not found (%v): install Debian's etcd-server (.ci/run does) or set VOYAGER_TEST_ETCD", err))
	}
	return path
}

// runEtcd starts etcd at path with args, its output in dir/etcd.log, and
// kills it at cleanup.
func runEtcd(tb testing.TB, path, dir string, args ...string) *exec.Cmd {
	tb.Helper()
	return runEtcdEnv(tb, path, dir, nil, args...)
}

// runEtcdEnv is runEtcd with env added to the test process's environment.
func runEtcdEnv(tb testing.TB, path, dir string, env []string, args ...string) *exec.Cmd {
	tb.Helper()
	return runEtcdIn(tb, path, dir, "", env, args...)
}

// runEtcdIn is runEtcdEnv with cwd as etcd's working directory ("": the
// test's).
func runEtcdIn(tb testing.TB, path, dir, cwd string, env []string, args ...string) *exec.Cmd {
	tb.Helper()
	cmd := exec.Command(path, args...)
	cmd.Dir = cwd
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	logf, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	// Die with the test binary: a test killed by its timeout runs no
	// cleanup, and an etcd left running holds a core and its data dir.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start etcd: %v", err)
	}
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = logf.Close()
	})
	return cmd
}

// waitAnswers waits until etcd answers a read through cli, failing tb with
// dir/etcd.log after 30 seconds.
func waitAnswers(tb testing.TB, cli *clientv3.Client, dir string) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Get(ctx, "health")
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "etcd.log"))
			tb.Fatalf("etcd did not answer within 30s: %v\n%s", err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// CPU is the CPU time etcd's process has used so far: the sum over its
// threads of the time the kernel ran them (/proc/<pid>/task/*/schedstat,
// nanoseconds, where /proc/<pid>/stat counts 10-ms ticks). A benchmark
// calls it every few milliseconds from the process it measures, so it
// keeps each thread's file open and reads it again in place, listing the
// threads anew only every cpuRelist: listing and opening them at each
// call took about 90 µs a reading on this 2-core machine against 11
// (BenchmarkExternalCPU), 2-5% of the measured process's core at a reading
// every 5 ms, taken from the placers beside etcd's own core.
func (e *External) CPU() (time.Duration, error) {
	e.cpu.Lock()
	defer e.cpu.Unlock()
	if e.cpu.files == nil || time.Since(e.cpu.listed) > cpuRelist {
		if err := e.listThreads(); err != nil {
			return 0, err
		}
	}
	var sum time.Duration
	var buf [128]byte
	for tid, f := range e.cpu.files {
		n, err := f.ReadAt(buf[:], 0)
		if n == 0 && err != nil {
			if errors.Is(err, syscall.ESRCH) || errors.Is(err, io.EOF) {
				// The thread has exited; what it ran stays in the process's
				// total, which /proc no longer splits: keep its last reading.
				sum += e.cpu.last[tid]
				continue
			}
			return 0, fmt.Errorf("read etcd's thread %d: %w", tid, err)
		}
		ns, err := schedstatNS(buf[:n])
		if err != nil {
			return 0, fmt.Errorf("read etcd's thread %d: %w", tid, err)
		}
		e.cpu.last[tid] = time.Duration(ns)
		sum += time.Duration(ns)
	}
	return sum, nil
}

// cpuRelist is how often CPU lists etcd's threads again (Go starts new
// ones now and then).
const cpuRelist = 250 * time.Millisecond

// PID is etcd's process id.
func (e *External) PID() int { return e.cmd.Process.Pid }

// listThreads opens the schedstat file of each of etcd's threads not yet
// open. Files of exited threads stay: reading them fails, and CPU counts
// their last reading.
func (e *External) listThreads() error {
	dir := fmt.Sprintf("/proc/%d/task", e.cmd.Process.Pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list etcd's threads: %w", err)
	}
	if e.cpu.files == nil {
		e.cpu.files, e.cpu.last = map[int]*os.File{}, map[int]time.Duration{}
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil || e.cpu.files[tid] != nil {
			continue
		}
		f, err := os.Open(filepath.Join(dir, t.Name(), "schedstat"))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
				continue // the thread has exited
			}
			return fmt.Errorf("open etcd's thread %s: %w", t.Name(), err)
		}
		e.cpu.files[tid] = f
	}
	e.cpu.listed = time.Now()
	return nil
}

// schedstatNS parses a schedstat line's first field: nanoseconds run.
func schedstatNS(b []byte) (int64, error) {
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, errors.New("empty schedstat")
	}
	return strconv.ParseInt(f[0], 10, 64)
}

// Client returns a client of e, closed at cleanup.
func (e *External) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		tb.Fatalf("etcd client: %v", err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}
