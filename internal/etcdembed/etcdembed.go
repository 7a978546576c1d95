package etcdembed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
)

// Config says where the embedded etcd keeps its data and listens.
type Config struct {
	// Dir is the data directory. It is created if absent and reused if it
	// already holds a member, so state survives restarts.
	Dir string
	// ClientAddr is the host:port clients connect to. Empty picks a free
	// loopback port.
	ClientAddr string
	// PeerAddr is the host:port of the (single-member) raft peer listener.
	// Empty picks a free loopback port.
	PeerAddr string
	// NoFsync turns fsync off. Only for tests whose subject is not
	// durability: it makes etcd several times faster on slow disks.
	NoFsync bool
	// LogLevel is etcd's own log level (debug, info, warn, error). Empty
	// means "error": etcd is chatty and Voyager logs what matters itself.
	LogLevel string
	// StartTimeout bounds how long Start waits for the server to be ready.
	// Zero means 30 seconds.
	StartTimeout time.Duration
	// CompactionRetention turns on etcd's periodic auto-compaction: it
	// keeps this much history and compacts older revisions (etcd checks
	// every tenth of the retention, at most hourly). Zero keeps all history.
	// Watchers that fall behind a compaction relist (watcher/).
	CompactionRetention time.Duration
	// QuotaBytes is the backend's space quota; past it etcd raises a
	// NOSPACE alarm and refuses writes. Zero means etcd's default (2 GiB).
	QuotaBytes int64
}

// Server is a running embedded etcd.
type Server struct {
	etcd      *embed.Etcd
	clientURL string
	closeOnce sync.Once
}

// Start starts an embedded etcd and waits until it serves requests.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Dir == "" {
		return nil, errors.New("start etcd: data directory is empty; set Config.Dir")
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("create etcd data directory: %w", err)
	}
	// A free port found now may be taken by the time etcd binds it; retry a
	// few times when we chose the port ourselves.
	attempts := 1
	if cfg.ClientAddr == "" || cfg.PeerAddr == "" {
		attempts = 5
	}
	var lastErr error
	for i := 0; i < attempts; i++ {
		s, err := start(ctx, cfg)
		if err == nil {
			return s, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

func start(ctx context.Context, cfg Config) (*Server, error) {
	clientAddr, peerAddr := cfg.ClientAddr, cfg.PeerAddr
	var err error
	if clientAddr == "" {
		if clientAddr, err = freeLoopbackAddr(); err != nil {
			return nil, err
		}
	}
	if peerAddr == "" {
		if peerAddr, err = freeLoopbackAddr(); err != nil {
			return nil, err
		}
	}
	curl, err := url.Parse("http://" + clientAddr)
	if err != nil {
		return nil, fmt.Errorf("parse etcd client address %q (want host:port): %w", clientAddr, err)
	}
	purl, err := url.Parse("http://" + peerAddr)
	if err != nil {
		return nil, fmt.Errorf("parse etcd peer address %q (want host:port): %w", peerAddr, err)
	}

	ec := embed.NewConfig()
	ec.Name = "voyager"
	ec.Dir = cfg.Dir
	ec.ListenClientUrls = []url.URL{*curl}
	ec.AdvertiseClientUrls = []url.URL{*curl}
	ec.ListenPeerUrls = []url.URL{*purl}
	ec.AdvertisePeerUrls = []url.URL{*purl}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.UnsafeNoFsync = cfg.NoFsync
	if cfg.CompactionRetention > 0 {
		ec.AutoCompactionMode = embed.CompactorModePeriodic
		ec.AutoCompactionRetention = cfg.CompactionRetention.String()
	}
	ec.QuotaBackendBytes = cfg.QuotaBytes
	ec.LogLevel = cfg.LogLevel
	if ec.LogLevel == "" {
		ec.LogLevel = "error"
	}
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(serverZap(ec.LogLevel))
	// An existing member directory means "rejoin", which embed decides from
	// the WAL; ClusterState only matters on first boot.
	ec.ClusterState = embed.ClusterStateFlagNew

	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	timeout := cfg.StartTimeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	case <-t.C:
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("start embedded etcd: not ready after %s", timeout)
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("start embedded etcd: %w", ctx.Err())
	}
	return &Server{etcd: e, clientURL: curl.String()}, nil
}

// Endpoint is the client URL, for example http://127.0.0.1:23790.
func (s *Server) Endpoint() string { return s.clientURL }

// Client returns a new client connected to this server. The caller closes it.
func (s *Server) Client() (*clientv3.Client, error) {
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{s.clientURL},
		DialTimeout: 5 * time.Second,
		Logger:      quietZap(),
	})
	if err != nil {
		return nil, fmt.Errorf("connect to embedded etcd: %w", err)
	}
	return c, nil
}

// Err reports a fatal server error after start (for example a lost disk).
func (s *Server) Err() <-chan error { return s.etcd.Err() }

// Close stops the server and waits for it to release its data directory.
// It is safe to call more than once (etcd's own Close is not).
func (s *Server) Close() {
	s.closeOnce.Do(s.etcd.Close)
}

func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find free loopback port: %w", err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		return "", fmt.Errorf("release probe port: %w", err)
	}
	return addr, nil
}
