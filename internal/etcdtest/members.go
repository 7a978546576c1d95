package etcdtest

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
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
	dirs  []string
	procs []*exec.Cmd // nil while killed
}

// StartMembers starts a cluster of n members with fsync off, waits until
// it answers, and stops every member at cleanup.
func StartMembers(tb testing.TB, n int) *Members {
	tb.Helper()
	path := etcdBinary(tb)
	m := &Members{tb: tb, path: path, procs: make([]*exec.Cmd, n)}
	peers := make([]string, n)
	clients := make([]string, n)
	cluster := make([]string, n)
	for i := range n {
		clients[i], peers[i] = freePort(tb), freePort(tb)
		cluster[i] = fmt.Sprintf("m%d=http://%s", i, peers[i])
	}
	token := fmt.Sprintf("members-%d", time.Now().UnixNano())
	for i := range n {
		dir := tb.TempDir()
		m.dirs = append(m.dirs, dir)
		m.Endpoints = append(m.Endpoints, "http://"+clients[i])
		m.args = append(m.args, []string{
			"--name", fmt.Sprintf("m%d", i),
			"--data-dir", filepath.Join(dir, "data"),
			"--listen-client-urls", "http://" + clients[i],
			"--advertise-client-urls", "http://" + clients[i],
			"--listen-peer-urls", "http://" + peers[i],
			"--initial-advertise-peer-urls", "http://" + peers[i],
			"--initial-cluster", strings.Join(cluster, ","),
			"--initial-cluster-state", "new",
			"--initial-cluster-token", token,
			"--log-level", "error", "--unsafe-no-fsync",
		})
	}
	for i := range n {
		m.procs[i] = runEtcd(tb, path, m.dirs[i], m.args[i]...)
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
		m.procs[i] = runEtcd(m.tb, m.path, m.dirs[i], m.args[i]...)
	}
}
