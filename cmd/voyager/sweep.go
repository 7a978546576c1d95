package main

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/sweep"
)

// sweepComponent is the job-array controller of a placer process (and of
// voyager dev), with its metrics registered.
func sweepComponent(cli *clientv3.Client, cfg config.Config, log *slog.Logger, reg *prometheus.Registry) component {
	c := sweep.New(cli, sweep.Config{Keys: state.MustKeys(cfg.EtcdPrefix), Budget: state.TxnBudget{MaxOps: cfg.PlacerMaxTxnOps}, Logger: log})
	reg.MustRegister(c.Collectors()...)
	return component{name: "sweep", run: c.Run}
}
