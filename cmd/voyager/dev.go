package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/console"
	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/internal/etcdembed"
	"github.com/voyager-gpu/voyager/internal/etcdhealth"
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
			if err := dev(cmd.Context(), cfg, log, cmd.ErrOrStderr()); err != nil {
				log.Error("voyager dev failed", "err", err)
				return exitCode(exitError)
			}
			return nil
		},
	}
	return withSettings(cmd)
}

// dev opens etcd, then runs the components under supervise until ctx ends
// or one fails, then closes etcd last: every component depends on it. Once
// all is up it writes the start block to out.
func dev(ctx context.Context, cfg config.Config, log *slog.Logger, out io.Writer) error {
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
	shared := newSharedCaches(store.client, cfg, log)
	pl := newPlacer(store.client, cfg, log, shared)
	registry.MustRegister(pl.Collectors()...)
	mux := http.NewServeMux()
	httpserver.Routes(mux, etcdProbes(registry, store.client, cfg.EtcdPrefix))
	secret, err := devAPISecret(cfg, store.server != nil, log)
	if err != nil {
		return err
	}
	apiSrv, closeAudit, err := newAPI(store.client, cfg, secret, log)
	if err != nil {
		return err
	}
	defer closeAudit()
	registry.MustRegister(apiSrv.Collectors()...)
	apiSrv.Mount(mux)
	if err := console.Mount(apiSrv.Engine(), mux, console.Config{Logger: log}); err != nil {
		return err
	}
	hs, err := listenHTTP(cfg, mux, log)
	if err != nil {
		return err
	}
	log.Debug("http listening", "addr", hs.Addr())

	comps := []component{
		httpComponent(hs),
		{name: "caches", run: shared.Run},
		placerComponent(pl),
		apiComponent(apiSrv),
	}
	ret, err := newRetention(store.client, cfg, log)
	if err != nil {
		return err
	}
	registry.MustRegister(ret.Collectors()...)
	comps = append(comps, component{name: "retention", run: afterFirstPass(pl, ret.Run)}, accountantComponent(store.client, cfg, log, registry))
	lc := newLifecycle(store.client, cfg, log, shared)
	registry.MustRegister(lc.Collectors()...)
	comps = append(comps, component{name: "lifecycle", run: afterFirstPass(pl, lc.Run)}, mergerComponent(store.client, cfg, log, registry, pl.ID()),
		sweepComponent(store.client, cfg, log, registry))
	// The agent: where it cannot run (no containerd and not root), dev
	// says why and goes on without it; sessions then wait in the queue.
	parts, err := newAgent(ctx, store.client, cfg, log, true)
	if err != nil {
		log.Warn("voyager dev runs WITHOUT a node agent: no session can start", "err", err,
			"fix", "run as root with containerd and runc installed (deploy/dev-setup.sh), or point "+config.EnvAgentContainerd+" at a containerd socket")
	} else {
		defer parts.close()
		registry.MustRegister(parts.agent.Collectors()...)
		mux.Handle(nodeagent.LogsPath, parts.agent.LogsHandler())
		mux.Handle(nodeagent.DashboardPath, parts.agent.DashboardHandler())
		mux.Handle(nodeagent.ExecPath, parts.agent.ExecHandler())
		mux.Handle(nodeagent.ForwardPath, parts.agent.ForwardHandler())
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
	log.Debug("voyager dev ready", "etcd", store.endpoint, "http", "http://"+hs.Addr())
	writeDevBlock(ctx, out, cfg, store, "http://"+hs.Addr(), parts)
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
	log.Debug("etcd connected", "endpoints", endpoints)
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
		// Without compaction every status and ledger write stays in the
		// history until the quota makes etcd read-only.
		CompactionRetention: cfg.EtcdCompaction,
		QuotaBytes:          cfg.EtcdQuotaMiB << 20,
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
	log.Debug("etcd listening", "endpoint", srv.Endpoint(), "data_dir", etcdDir, "reused", reused)
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

// etcdProbes registers etcd's gauges (alarms, database size) on registry
// and returns the process's probes: ready while etcd answers a
// linearizable read and raises no alarm (etcdhealth).
func etcdProbes(registry *prometheus.Registry, cli *clientv3.Client, prefix string) httpserver.Probes {
	registry.MustRegister(etcdhealth.NewCollector(cli))
	return httpserver.Probes{Ready: etcdhealth.Ready(cli, prefix), Gatherer: registry}
}

// jupyterImageRef is the notebook image make image builds from Debian's
// packages and loads (deploy/images/jupyter/build.sh).
const jupyterImageRef = "voyager.local/jupyter:latest"

// writeDevBlock writes what a new user of voyager dev needs, in one block:
// where the API is, how to get a token, where etcd is, what was simulated
// and how to open a notebook. parts is nil when dev runs without an agent.
func writeDevBlock(ctx context.Context, out io.Writer, cfg config.Config, st *store, apiURL string, parts *agentParts) {
	self := os.Args[0]
	if filepath.IsAbs(self) || !strings.Contains(self, "/") {
		self = "voyager"
	}
	var b strings.Builder
	row := func(k, format string, a ...any) { fmt.Fprintf(&b, "  %-10s %s\n", k, fmt.Sprintf(format, a...)) }
	fmt.Fprintf(&b, "\nvoyager dev is running (Ctrl-C stops it; VOYAGER_LOG_LEVEL=debug shows routine events)\n")
	row("API", "%s/api/v1/  (OpenAPI at /openapi.json; /healthz, /readyz, /metrics)", apiURL)
	if apiURL != "http://127.0.0.1:7070" {
		row("", "export VOYAGER_URL=%s", apiURL)
	}
	if cfg.JWTSecret == "" && st.server == nil {
		row("token", "none can be minted: set %s (this run's secret is random)", config.EnvJWTSecret)
	} else {
		row("token", "export VOYAGER_TOKEN=$(%s token)   (add --admin for an admin's)", self)
	}
	if st.server != nil {
		row("etcd", "%s, embedded; data in %s", st.endpoint, filepath.Join(cfg.DataDir, "etcd"))
	} else {
		row("etcd", "%s (%s)", st.endpoint, config.EnvEtcdEndpoints)
	}
	row("", "etcdctl --endpoints=%s get --prefix %s/", st.endpoint, cfg.EtcdPrefix)
	if parts == nil {
		row("node", "NONE: no node agent runs (see the warning above); sessions wait in the queue")
	} else {
		byModel := map[string]int{}
		for _, g := range parts.gpus {
			byModel[g.Model+gpuModeNote(g)]++
		}
		gpus := models(byModel)
		if parts.simulated {
			gpus += "; no NVIDIA driver here, so these are made up (containers see /dev/null as /dev/nvidiaN)"
		}
		if len(parts.gpus) == 0 {
			gpus = "no GPUs"
		}
		row("node", "%s: %s", parts.node, gpus)
		how := "this machine's"
		if parts.daemon != nil {
			how = "started by voyager dev"
		}
		row("containerd", "%s (%s), namespace %s", parts.containerd, how, cfg.AgentNamespace)
		row("images", "%s for sessions that name none", cfg.AgentImage)
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		loaded := parts.rt.EnsureImage(ictx, jupyterImageRef) == nil
		cancel()
		if loaded {
			row("", "%s loaded", jupyterImageRef)
		} else {
			row("", "%s NOT loaded yet: make image builds it from Debian's packages and loads it", jupyterImageRef)
		}
	}
	row("notebook", "id=$(%s session create --gpus 1 --image %s -o name)", self, jupyterImageRef)
	row("", "%s session wait $id && %s session get $id   # open its jupyter URL (it holds the token)", self, self)
	row("batch", "%s run -- sh -c 'echo hi; exit 3'; echo $?", self)
	fmt.Fprintln(out, b.String())
}
