package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/internal/httpserver"
	"github.com/voyager-gpu/voyager/lifecycle"
	"github.com/voyager-gpu/voyager/merger"
	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
)

const placerLong = `Runs a placer until SIGINT or SIGTERM: it watches the queue in etcd and
binds pending sessions to GPUs. Run as many as you like, on any machines:
the oldest plans and binds, the others stand by with their caches warm
and take over when it stops (at once) or dies (within its lease TTL), and
no GPU is ever handed out twice (placer/README.md). It
serves /healthz, /readyz and /metrics on VOYAGER_HTTP_ADDR. One placer at
a time (an etcd election) also retires finished sessions after
VOYAGER_RETENTION, appending their records to VOYAGER_HISTORY_FILE, and
one (another election) runs the lifecycle rules: idle notebooks, max
runtimes, drained nodes, preemption and restarts after failures, each
stop announced by a warning first.`

func newPlacerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "placer",
		Short:   "Run a placer: bind pending sessions to GPUs (any number may run)",
		Long:    placerLong,
		GroupID: groupProcesses,
		Args:    cobra.NoArgs,
		RunE:    runPlacer,
	}
	return withSettings(cmd, append([]string{
		config.EnvEtcdEndpoints, config.EnvEtcdPrefix, config.EnvEtcdDialTimeout, config.EnvHTTPAddr,
		config.EnvLogLevel, config.EnvLogFormat,
		config.EnvPlacerStrategy, config.EnvPlacerReserveAfter, config.EnvPlacerShortFirst, config.EnvPlacerMaxTxnOps, config.EnvPlacerLeaseTTL,
		config.EnvPlacerUsageHalfLife, config.EnvPlacerRuntimeEstimates, config.EnvMaxSessionsPerNode, config.EnvDataDir, config.EnvRetention, config.EnvHistoryFile,
		config.EnvIdleTimeout, config.EnvStopWarning, config.EnvMaxRuntime, config.EnvDrainDeadline,
		config.EnvPreemptGrace, config.EnvPreemptNotebooks, config.EnvElasticInterval, config.EnvElasticNotice, config.EnvPlacerGoodput,
	}, secureEnvs...)...)
}

func runPlacer(cmd *cobra.Command, _ []string) error {
	cfg, err := loadClusterConfig(cmd)
	if err != nil {
		return err
	}
	return runProcess(cmd, "placer", cfg, func(proc *process) ([]component, error) {
		cli, log := proc.cli, proc.log
		registry := httpserver.NewRegistry()
		shared := newSharedCaches(cli, cfg, log)
		p := newPlacer(cli, cfg, log, shared)
		registry.MustRegister(p.Collectors()...)
		lc := newLifecycle(cli, cfg, log, shared)
		registry.MustRegister(lc.Collectors()...)
		mux := http.NewServeMux()
		httpserver.Routes(mux, etcdProbes(registry, cli, cfg.EtcdPrefix))
		hs, err := listenHTTP(cfg, mux, log)
		if err != nil {
			return nil, err
		}
		log.Info("http listening", "addr", hs.Addr())
		ret, err := newRetention(cli, cfg, log)
		if err != nil {
			return nil, err
		}
		registry.MustRegister(ret.Collectors()...)
		return []component{
			httpComponent(hs),
			{name: "caches", run: shared.Run},
			placerComponent(p),
			selfEndpoint(cli, cfg, state.EndpointPlacer, hs.Addr(), log),
			{name: "retention", run: afterFirstPass(p, ret.Run)},
			{name: "lifecycle", run: afterFirstPass(p, lc.Run)},
			accountantComponent(cli, cfg, log, registry),
			mergerComponent(cli, cfg, log, registry, p.ID()),
			sweepComponent(cli, cfg, log, registry),
		}, nil
	})
}

// planOptions are the planning settings every planner of the process uses
// (placers, the lifecycle controller's preemption search, the API's queue
// view and feasibility check), so that they all plan alike.
func planOptions(cfg config.Config) placer.PlanOptions {
	return placer.PlanOptions{Strategy: placer.Strategy(cfg.PlacerStrategy), ReserveAfter: cfg.PlacerReserveAfter,
		MaxSessionsPerNode: cfg.MaxSessionsPerNode, MaxTxnOps: cfg.PlacerMaxTxnOps, ShortFirst: cfg.PlacerShortFirst}
}

// newSharedCaches builds the caches that the process's placer and
// lifecycle controller share; run them as a component beside both.
func newSharedCaches(cli *clientv3.Client, cfg config.Config, log *slog.Logger) *placer.SharedCaches {
	return placer.NewSharedCaches(cli, state.MustKeys(cfg.EtcdPrefix), log) // Load validated the prefix
}

// newPlacer builds a placer from the process configuration, reading the
// process's shared caches.
func newPlacer(cli *clientv3.Client, cfg config.Config, log *slog.Logger, shared *placer.SharedCaches) *placer.Placer {
	return placer.New(cli, placer.Config{
		Shared:    shared,
		Keys:      state.MustKeys(cfg.EtcdPrefix), // Load validated the prefix
		Plan:      planOptions(cfg),
		MaxTxnOps: cfg.PlacerMaxTxnOps,
		LeaseTTL:  cfg.PlacerLeaseTTL,
		Logger:    log,

		UsageHalfLife:    cfg.PlacerUsageHalfLife,
		RuntimeEstimates: cfg.PlacerRuntimeEstimates,
	})
}

// mergerComponent folds the parts agents report into session statuses
// (package merger): every placer process runs one, as does dev, sharing
// the sessions with the other placer processes' as member (its placer's
// id).
func mergerComponent(cli *clientv3.Client, cfg config.Config, log *slog.Logger, reg *prometheus.Registry, member string) component {
	m := merger.New(cli, merger.Config{Keys: state.MustKeys(cfg.EtcdPrefix), Logger: log, Member: member})
	reg.MustRegister(m.Collectors()...)
	return component{name: "merger", run: m.Run}
}

// afterFirstPass runs run once p's first pass has ended. The lifecycle
// controller lists every session and status of the site for caches of its
// own, and the retention sweeper every status on its first sweep: started
// with the placer, their lists took turns with the placer's for etcd and
// the cores, and at 10,000 nodes and 100,000 queued the placer's first
// binding came 5-7 s after start (2.6-3.1 s with both after its first
// pass). Nothing either does is urgent in a process's first seconds, and a
// lost node is the placer's own to clear.
func afterFirstPass(p *placer.Placer, run func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		select {
		case <-p.Passed():
		case <-ctx.Done():
			return nil
		}
		return run(ctx)
	}
}

func placerComponent(p *placer.Placer) component {
	return component{name: "placer", run: p.Run}
}

// newLifecycle builds the lifecycle controller from the process
// configuration, reading the process's shared caches; it plans preemptions
// the way the placers plan.
func newLifecycle(cli *clientv3.Client, cfg config.Config, log *slog.Logger, shared *placer.SharedCaches) *lifecycle.Controller {
	return lifecycle.NewController(cli, lifecycle.ControllerConfig{
		Shared:           shared,
		Keys:             state.MustKeys(cfg.EtcdPrefix),
		IdleTimeout:      cfg.IdleTimeout,
		StopWarning:      cfg.StopWarning,
		MaxRuntime:       cfg.MaxRuntime,
		DrainDeadline:    cfg.DrainDeadline,
		PreemptGrace:     cfg.PreemptGrace,
		PreemptNotebooks: cfg.PreemptNotebooks,
		ResizeInterval:   cfg.ElasticInterval,
		ResizeNotice:     cfg.ElasticNotice,
		Goodput:          cfg.PlacerGoodput,
		Plan:             planOptions(cfg),
		Logger:           log,
	})
}

// newRetention builds the sweeper that moves finished sessions to history.
func newRetention(cli *clientv3.Client, cfg config.Config, log *slog.Logger) (*lifecycle.Retention, error) {
	if cfg.HistoryFile == "" {
		return nil, fmt.Errorf("find the history file: neither XDG_DATA_HOME nor HOME is set; set %s", config.EnvHistoryFile)
	}
	return lifecycle.NewRetention(cli, lifecycle.RetentionConfig{
		Keys:        state.MustKeys(cfg.EtcdPrefix),
		After:       cfg.Retention,
		AccrualWait: cfg.RetentionAccrualWait,
		HistoryPath: cfg.HistoryFile,
		Logger:      log,
	})
}
