package etcdtest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdembed"
)

// Options adjust the test server.
type Options struct {
	// Fsync keeps fsync on. Tests default to fsync off for speed;
	// benchmarks that report durable throughput turn it on.
	Fsync bool
	// Dir reuses a data directory (to restart a server over the same data).
	// Empty uses a fresh t.TempDir().
	Dir string
	// ClientAddr pins the client address (to restart on the same port).
	ClientAddr string
}

// Cluster is a started test etcd.
type Cluster struct {
	Server *etcdembed.Server
	Dir    string
}

// Start starts an embedded etcd for tb and stops it at cleanup.
func Start(tb testing.TB, opts Options) *Cluster {
	tb.Helper()
	dir := opts.Dir
	if dir == "" {
		dir = tb.TempDir()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := etcdembed.Start(ctx, etcdembed.Config{
		Dir:        dir,
		ClientAddr: opts.ClientAddr,
		NoFsync:    !opts.Fsync,
		// etcd logs expected shutdown noise ("use of closed network
		// connection") at error level; a real failure fails the test.
		LogLevel: "fatal",
	})
	if err != nil {
		tb.Fatalf("start etcd: %v", err)
	}
	tb.Cleanup(s.Close)
	return &Cluster{Server: s, Dir: dir}
}

// Client returns a client for c, closed at cleanup.
func (c *Cluster) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	cli, err := c.Server.Client()
	if err != nil {
		tb.Fatalf("etcd client: %v", err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}

// New is Start with default options followed by Client: the common case.
func New(tb testing.TB) *clientv3.Client {
	tb.Helper()
	return Start(tb, Options{}).Client(tb)
}
