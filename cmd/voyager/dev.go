package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/console"
	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/internal/etcdembed"
	"github.com/voyager-gpu/voyager/internal/httpserver"
	"github.com/voyager-gpu/voyager/nodeagent"
)

// httpShutdownTimeout bounds the graceful stop of the HTTP server; requests
// still running after it are cut off.
const httpShutdownTimeout = 10 * time.Second

const devLong = `Runs an all-in-one Voyager on this machine until SIGINT or SIGTERM: an
embedded etcd (kept in <data dir>/etcd across runs), a placer, a node agent
(containerd, started privately under <data dir>/containerd if none answers;
GPUs simulated, and marked so, where NVML is absent), and the HTTP
server (/healthz, /readyz, /metrics, and the API under /api/v1/). With
VOYAGER_JWT_SECRET empty it keeps a random token secret in <data dir>/jwt-secret,
which voyager token reads. With VOYAGER_ETCD_ENDPOINTS set it uses that
etcd instead of the embedded one.`

func newDevCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "dev",
		Short:   "Run an all-in-one Voyager on this machine (embedded etcd, placer, agent, API)",
		Long:    devLong,
		GroupID: groupProcesses,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			log := cfg.NewLogger(cmd.ErrOrStderr())
			if err := dev(cmd.Context(), cfg, log); err != nil {
				log.Error("voyager dev failed", "err", err)
				return exitCode(exitError)
			}
			return nil
		},
	}
	return withSettings(cmd)
}

// dev opens etcd, then runs the components under supervise until ctx ends
// or one fails, then closes etcd last: every component depends on it.
func dev(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	store, err := openStore(ctx, cfg, log)
	if err != nil {
		if ctx.Err() != nil { // interrupted while starting: a clean stop
			log.Info("stopped", "reason", context.Cause(ctx).Error())
			return nil
		}
		return err
	}
	defer func() {
		store.close()
		log.Info("stopped")
	}()

	registry := httpserver.NewRegistry()
	pl := newPlacer(store.client, cfg, log)
	registry.MustRegister(pl.Collectors()...)
	mux := http.NewServeMux()
	httpserver.Routes(mux, httpserver.Probes{
		Ready:    etcdReady(store.client, cfg.EtcdPrefix),
		Gatherer: registry,
	})
	secret, err := devAPISecret(cfg, store.server != nil, log)
	if err != nil {
		return err
	}
	apiSrv, err := newAPI(store.client, cfg, secret, log)
	if err != nil {
		return err
	}
	registry.MustRegister(apiSrv.Collectors()...)
	apiSrv.Mount(mux)
	if err := console.Mount(apiSrv.Engine(), mux, console.Config{Logger: log}); err != nil {
		return err
	}
	hs, err := listenHTTP(cfg, mux, log)
	if err != nil {
		return err
	}
	log.Info("http listening", "addr", hs.Addr())

	comps := []component{
		{name: "http", run: func(ctx context.Context) error { return hs.Run(ctx, httpShutdownTimeout) }},
		placerComponent(pl),
		apiComponent(apiSrv),
	}
	ret, err := newRetention(store.client, cfg, log)
	if err != nil {
		return err
	}
	comps = append(comps, component{name: "retention", run: ret.Run})
	lc := newLifecycle(store.client, cfg, log)
	registry.MustRegister(lc.Collectors()...)
	comps = append(comps, component{name: "lifecycle", run: lc.Run})
	// The agent: where it cannot run (no containerd and not root), dev
	// says why and goes on without it; sessions then wait in the queue.
	if parts, err := newAgent(ctx, store.client, cfg, log, true); err != nil {
		log.Warn("voyager dev runs WITHOUT a node agent: no session can start", "err", err,
			"fix", "run as root with containerd and runc installed (deploy/dev-setup.sh), or point "+config.EnvAgentContainerd+" at a containerd socket")
	} else {
		defer parts.close()
		registry.MustRegister(parts.agent.Collectors()...)
		mux.Handle(nodeagent.LogsPath, parts.agent.LogsHandler())
		comps = append(comps, parts.component())
	}
	if store.server != nil {
		comps = append(comps, component{name: "etcd", run: func(ctx context.Context) error {
			select {
			case err := <-store.server.Err():
				return fmt.Errorf("embedded etcd: %w", err)
			case <-ctx.Done():
				return nil
			}
		}})
	}
	log.Info("voyager dev ready", "etcd", store.endpoint, "http", "http://"+hs.Addr())
	return supervise(ctx, log, comps)
}

// store is the etcd that dev runs on: an embedded server, or an external
// cluster (server nil).
type store struct {
	server   *etcdembed.Server
	client   *clientv3.Client
	endpoint string
}

func (s *store) close() {
	_ = s.client.Close()
	if s.server != nil {
		s.server.Close()
	}
}

func openStore(ctx context.Context, cfg config.Config, log *slog.Logger) (*store, error) {
	if len(cfg.EtcdEndpoints) > 0 {
		return connectExternal(ctx, cfg, log)
	}
	return startEmbedded(ctx, cfg, log)
}

func connectExternal(ctx context.Context, cfg config.Config, log *slog.Logger) (*store, error) {
	endpoints := strings.Join(cfg.EtcdEndpoints, ",")
	cc, err := cfg.EtcdClientConfig()
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		return nil, fmt.Errorf("connect to etcd at %s (%s): %w", endpoints, config.EnvEtcdEndpoints, err)
	}
	// clientv3.New does not wait for a connection; a read does.
	gctx, cancel := context.WithTimeout(ctx, cfg.EtcdDialTimeout)
	defer cancel()
	if _, err := cli.Get(gctx, cfg.EtcdPrefix, clientv3.WithCountOnly()); err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("connect to etcd at %s (%s, timeout %s from %s): %w",
			endpoints, config.EnvEtcdEndpoints, cfg.EtcdDialTimeout, config.EnvEtcdDialTimeout, err)
	}
	log.Info("etcd connected", "endpoints", endpoints)
	return &store{client: cli, endpoint: endpoints}, nil
}

func startEmbedded(ctx context.Context, cfg config.Config, log *slog.Logger) (*store, error) {
	if cfg.DataDir == "" {
		return nil, fmt.Errorf("find data directory: neither XDG_DATA_HOME nor HOME is set; set %s", config.EnvDataDir)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data directory (%s): %w", config.EnvDataDir, err)
	}
	if fi, err := os.Stat(cfg.DataDir); err == nil && fi.Mode().Perm()&0o077 != 0 {
		log.Warn("data dir is accessible to other users", "data_dir", cfg.DataDir, "mode", fi.Mode().Perm().String())
	}
	etcdDir := filepath.Join(cfg.DataDir, "etcd")
	_, statErr := os.Stat(filepath.Join(etcdDir, "member"))
	reused := statErr == nil

	// etcd's own error for a busy port does not say which setting moves it;
	// probe both listeners first so the error can.
	for _, l := range []struct{ what, addr, env string }{
		{"etcd client", cfg.EtcdClientAddr, config.EnvEtcdClientAddr},
		{"etcd peer", cfg.EtcdPeerAddr, config.EnvEtcdPeerAddr},
	} {
		if err := probeListen(l.addr); err != nil {
			return nil, explainListen(err, l.what, l.addr, l.env)
		}
	}
	srv, err := etcdembed.Start(ctx, etcdembed.Config{
		Dir:        etcdDir,
		ClientAddr: cfg.EtcdClientAddr,
		PeerAddr:   cfg.EtcdPeerAddr,
	})
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use") {
			return nil, fmt.Errorf("%w (the ports are set by %s and %s)", err, config.EnvEtcdClientAddr, config.EnvEtcdPeerAddr)
		}
		return nil, err
	}
	cli, err := srv.Client()
	if err != nil {
		srv.Close()
		return nil, err
	}
	log.Info("etcd listening", "endpoint", srv.Endpoint(), "data_dir", etcdDir, "reused", reused)
	return &store{server: srv, client: cli, endpoint: srv.Endpoint()}, nil
}

// probeListen binds addr and releases it at once.
func probeListen(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return l.Close()
}

// explainListen turns a failed listen into an error that names the address
// and the variable that changes it.
func explainListen(err error, what, addr, envName string) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("listen %s on %s: address already in use (another voyager dev or etcd?); set %s to a free host:port", what, addr, envName)
	}
	return fmt.Errorf("listen %s on %s (set by %s): %w", what, addr, envName, err)
}

// etcdReady reports ready when etcd answers a linearizable read, which
// needs a leader and a quorum.
func etcdReady(cli *clientv3.Client, prefix string) httpserver.ReadyFunc {
	return func(ctx context.Context) error {
		if _, err := cli.Get(ctx, prefix, clientv3.WithCountOnly()); err != nil {
			return fmt.Errorf("read etcd: %w", err)
		}
		return nil
	}
}
