package etcdtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Members is an etcd cluster of Debian's etcd processes on loopback ports,
// whose members a test can kill (SIGKILL) and start again with their data:
// a leader's death, as a machine's, under load.
type Members struct {
	// Endpoints are the members' client URLs, by member.
	Endpoints []string

	tb    testing.TB
	path  string
	mu    sync.Mutex
	args  [][]string
	env   []string // added to each member's environment
	dirs  []string
	cwd   string      // the members' working directory; "" for the test's
	socks [][]string  // each member's unix sockets (Unix), by member
	procs []*exec.Cmd // nil while killed
}

// StartMembers starts a cluster of n members with fsync off, waits until
// it answers, and stops every member at cleanup.
func StartMembers(tb testing.TB, n int) *Members {
	tb.Helper()
	return StartMembersWith(tb, n, MembersOptions{})
}

// MembersOptions are settings of a cluster's members beyond StartMembers'.
type MembersOptions struct {
	// GOGC, when not 0, is each member's Go garbage collector target
	// (the GOGC environment variable; Go's default is 100): a higher one
	// trades memory for the collector's CPU, as a long soak wants.
	GOGC int
	// Args are more command-line flags for every member (etcd's own,
	// such as --snapshot-count=…), after the ones StartMembersWith sets.
	Args []string
	// Command, when set, is the executable each member runs instead of
	// Debian's etcd (or VOYAGER_TEST_ETCD): one that takes etcd's flags,
	// such as a test binary that runs etcd's own main (etcdmain.Main)
	// when Env says so.
	Command string
	// Env is added to each member's environment.
	Env []string
	// Unix, when set, has the members serve their clients and each other
	// on unix sockets in the cluster's own directory instead of loopback
	// TCP ports, as etcd's own integration tests do: on one machine a
	// write through a unix socket costs both ends a fraction of a loopback
	// TCP segment's trip through the network stack. Endpoints are then
	// unix:///… URLs, which clientv3 and Link dial.
	Unix bool
}

// StartMembersWith is StartMembers with opts.
func StartMembersWith(tb testing.TB, n int, opts MembersOptions) *Members {
	tb.Helper()
	path := opts.Command
	if path == "" {
		path = etcdBinary(tb)
	}
	m := &Members{tb: tb, path: path, procs: make([]*exec.Cmd, n), env: append([]string{}, opts.Env...)}
	if opts.Unix {
		// The sockets are named relative to the members' working
		// directory, which they share: etcd takes a unix URL's host:port
		// alone, as the socket's file name.
		m.cwd = tb.TempDir()
	}
	if opts.GOGC != 0 {
		m.env = append(m.env, fmt.Sprintf("GOGC=%d", opts.GOGC))
	}
	peers := make([]string, n)
	clients := make([]string, n)
	cluster := make([]string, n)
	scheme := "http://"
	for i := range n {
		if opts.Unix {
			clients[i], peers[i] = fmt.Sprintf("m%d.client:%d", i, i+1), fmt.Sprintf("m%d.peer:%d", i, i+1)
			scheme = "unix://"
			m.socks = append(m.socks, []string{filepath.Join(m.cwd, clients[i]), filepath.Join(m.cwd, peers[i])})
		} else {
			clients[i], peers[i] = FreeAddr(tb), FreeAddr(tb)
		}
		cluster[i] = fmt.Sprintf("m%d=%s%s", i, scheme, peers[i])
	}
	token := fmt.Sprintf("members-%d", time.Now().UnixNano())
	for i := range n {
		dir := tb.TempDir()
		m.dirs = append(m.dirs, dir)
		if opts.Unix {
			// The members take host:port URLs only, and so name their
			// sockets relative to their working directory; clients
			// dial the absolute path.
			m.Endpoints = append(m.Endpoints, "unix://"+filepath.Join(m.cwd, clients[i]))
		} else {
			m.Endpoints = append(m.Endpoints, "http://"+clients[i])
		}
		m.args = append(m.args, []string{
			"--name", fmt.Sprintf("m%d", i),
			"--data-dir", filepath.Join(dir, "data"),
			"--listen-client-urls", scheme + clients[i],
			"--advertise-client-urls", scheme + clients[i],
			"--listen-peer-urls", scheme + peers[i],
			"--initial-advertise-peer-urls", scheme + peers[i],
			"--initial-cluster", strings.Join(cluster, ","),
			"--initial-cluster-state", "new",
			"--initial-cluster-token", token,
			"--log-level", "error", "--unsafe-no-fsync",
		})
		m.args[i] = append(m.args[i], opts.Args...)
	}
	for i := range n {
		m.procs[i] = runEtcdIn(tb, path, m.dirs[i], m.cwd, m.env, m.args[i]...)
	}
	cli := m.Client(tb)
	waitAnswers(tb, cli, m.dirs[0])
	return m
}

// Client returns a client of every member, closed at cleanup.
func (m *Members) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: m.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Leader returns the index of the member that leads now, asking each live
// member in turn.
func (m *Members) Leader(ctx context.Context, cli *clientv3.Client) (int, error) {
	for i, ep := range m.Endpoints {
		m.mu.Lock()
		alive := m.procs[i] != nil
		m.mu.Unlock()
		if !alive {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := cli.Status(sctx, ep)
		cancel()
		if err == nil && st.Leader == st.Header.MemberId {
			return i, nil
		}
	}
	return -1, fmt.Errorf("find the etcd leader: no live member says it leads")
}

// Kill kills member i (SIGKILL), as a machine dies.
func (m *Members) Kill(i int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p := m.procs[i]; p != nil {
		_ = p.Process.Kill()
		_ = p.Wait()
		m.procs[i] = nil
	}
}

// Restart starts killed member i again on its data directory: it rejoins
// the cluster and catches up.
func (m *Members) Restart(i int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.procs[i] == nil {
		// A killed member leaves its sockets, and etcd 3.4 will not
		// listen where a file is.
		if m.socks != nil {
			for _, f := range m.socks[i] {
				if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
					m.tb.Errorf("restart member %d: %v", i, err)
				}
			}
		}
		m.procs[i] = runEtcdIn(m.tb, m.path, m.dirs[i], m.cwd, m.env, m.args[i]...)
	}
}

// CPU is the CPU time (user and system) each member's current process has
// used so far (/proc/<pid>/stat), by member; 0 for a member that is
// killed now. A killed member's time is its parent's, the test process's,
// to count: getrusage(RUSAGE_CHILDREN) holds it once the member was
// waited for, as Kill does.
func (m *Members) CPU() ([]time.Duration, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]time.Duration, len(m.procs))
	for i, p := range m.procs {
		if p == nil {
			continue
		}
		d, err := ProcessCPU(p.Process.Pid)
		if err != nil {
			return nil, err
		}
		out[i] = d
	}
	return out, nil
}

// ProcessCPU is the CPU time (user and system) process pid has used so
// far, from /proc/<pid>/stat's utime and stime (in clock ticks of 10 ms).
func ProcessCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read process %d's CPU: %w", pid, err)
	}
	// The command name (field 2) may hold spaces; the fields after its
	// closing parenthesis are state (3), …, utime (14), stime (15).
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("read process %d's CPU: no command name in %q", pid, s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("read process %d's CPU: %d fields after the command name, want 13 or more", pid, len(f))
	}
	var ticks int64
	for _, v := range f[11:13] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("read process %d's CPU: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}
