package main

import (
	"context"
	"log/slog"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/internal/httpserver"
)

// process is what a cluster process (voyager agent, api, placer) builds
// its components from: the command's context, its settings and logger,
// and its client of the cluster's etcd.
type process struct {
	ctx     context.Context
	cfg     config.Config
	log     *slog.Logger
	cli     *clientv3.Client
	closers []func()
}

// onExit runs f when the process ends, after its components stopped; the
// last registered runs first.
func (p *process) onExit(f func()) { p.closers = append(p.closers, f) }

// runProcess is the life of the cluster process name, whose settings cfg
// are loaded and checked: connect to etcd, build the components with
// start, supervise them until the command's context ends, then run what
// onExit registered and the etcd client's close. Any failure is logged as
// "voyager <name> failed" and exits 1.
func runProcess(cmd *cobra.Command, name string, cfg config.Config, start func(p *process) ([]component, error)) error {
	p := &process{ctx: cmd.Context(), cfg: cfg, log: cfg.NewLogger(cmd.ErrOrStderr())}
	defer func() {
		for i := len(p.closers) - 1; i >= 0; i-- {
			p.closers[i]()
		}
	}()
	err := func() error {
		store, err := connectExternal(p.ctx, cfg, p.log)
		if err != nil {
			return err
		}
		p.onExit(store.close)
		p.cli = store.client
		comps, err := start(p)
		if err != nil {
			return err
		}
		return supervise(p.ctx, p.log, comps)
	}()
	if err != nil {
		p.log.Error("voyager "+name+" failed", "err", err)
		return exitCode(exitError)
	}
	p.log.Info("stopped")
	return nil
}

// httpComponent serves hs until the process ends, then shuts it down
// within httpShutdownTimeout.
func httpComponent(hs *httpserver.Server) component {
	return component{name: "http", run: func(ctx context.Context) error { return hs.Run(ctx, httpShutdownTimeout) }}
}
