package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/history"
	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/state"
)

const checkLong = `Checks Voyager's safety rules over etcd's history, read-only: from a start
revision (default: now) it applies every revision of the keyspace to a model
and reports each revision after which a GPU is in two allocations (or held
whole beside a MIG device of it), a node is over its CPU, memory or ports,
a binding has no allocation or the reverse or names other devices or ports,
an allocated device is not in its node's inventory, a session's phase moved
along no edge of the state machine, a finished session was queued again, a
binding or allocation was left for a session that ended or was re-queued, a
session made no progress past --stuck-after, or an agent reported a part
(parts/<node>/<id>) for a binding its node does not hold, or a running
container whose binding is gone (history/README.md). Each violation is a
line "revision N key K rule R: detail" on stdout. Without --end or --follow
it checks up to the revision current when it started; --follow keeps
checking the live cluster until SIGINT. The start revision must not be
compacted; what came before it may be. Exit status 0: no violation; 1:
violations or an error; 2: bad usage.`

func newCheckCmd() *cobra.Command {
	var start, end int64
	var follow bool
	var stuckAfter time.Duration
	cmd := &cobra.Command{
		Use:     "check",
		Short:   "Check the safety rules over etcd's history, read-only (operators)",
		Long:    checkLong,
		GroupID: groupProcesses,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			return withCode(runCheck(cmd.Context(), cfg, checkRange{start, end, follow, stuckAfter}, cmd.OutOrStdout(), cmd.ErrOrStderr()))
		},
	}
	cmd.Flags().Int64Var(&start, "start", 0, "revision whose keyspace the check starts from; 0: the current revision")
	cmd.Flags().Int64Var(&end, "end", 0, "last revision to check; 0: the revision current at start (or none with --follow)")
	cmd.Flags().BoolVar(&follow, "follow", false, "keep checking new revisions until interrupted")
	cmd.Flags().DurationVar(&stuckAfter, "stuck-after", history.DefaultStuckAfter, "how long, by the history's own clock, a session may stay Bound, Starting or Stopping, or keep a part after it ended, before no-progress or left-behind reports it")
	return withSettings(cmd, config.EnvEtcdEndpoints, config.EnvEtcdPrefix, config.EnvEtcdDialTimeout, config.EnvLogLevel, config.EnvLogFormat)
}

// checkRange is which revisions `voyager check` reads.
type checkRange struct {
	start, end int64
	follow     bool
	stuckAfter time.Duration // 0: history.DefaultStuckAfter
}

// runCheck is `voyager check`: it returns the exit code, having written
// violations to stdout and the summary and errors to stderr.
func runCheck(ctx context.Context, cfg config.Config, r checkRange, stdout, stderr io.Writer) int {
	err := cfg.RequireEndpoints()
	if err == nil && (r.start < 0 || r.end < 0 || (r.follow && r.end != 0)) {
		err = fmt.Errorf("invalid revisions --start %d --end %d --follow=%v: want revisions >= 0, and --end or --follow, not both", r.start, r.end, r.follow)
	}
	if err != nil {
		writeConfigError(stderr, "voyager check", err)
		return exitUsage
	}
	k, err := state.NewKeys(cfg.EtcdPrefix)
	if err != nil {
		writeConfigError(stderr, "voyager check", err)
		return exitUsage
	}
	log := cfg.NewLogger(stderr)
	store, err := connectExternal(ctx, cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "voyager check: %v\n", err)
		return exitError
	}
	defer store.close()
	end := r.end
	if !r.follow && end == 0 {
		resp, err := store.client.Get(ctx, k.All(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			fmt.Fprintf(stderr, "voyager check: read current revision: %v\n", err)
			return exitError
		}
		end = resp.Header.Revision
	}
	res, err := history.Watch(ctx, store.client, k, history.Options{
		Start: r.start, End: end, StuckAfter: r.stuckAfter,
		OnViolation: func(v history.Violation) { fmt.Fprintln(stdout, v) },
	})
	fmt.Fprintf(stderr, "voyager check: revisions %d to %d under %s: %d applied, %d binds, %d violations\n", res.Start, res.Last, cfg.EtcdPrefix, res.Revisions, res.Binds, res.Count)
	if err != nil {
		if errors.Is(err, history.ErrCompacted) {
			fmt.Fprintf(stderr, "voyager check: %v (start at a later revision, or at 0 for now)\n", err)
		} else {
			fmt.Fprintf(stderr, "voyager check: %v\n", err)
		}
		return exitError
	}
	if res.Count > 0 {
		return exitError
	}
	return exitOK
}
