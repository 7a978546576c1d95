package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/voyager-gpu/voyager/internal/ctxwait"
	"github.com/voyager-gpu/voyager/state"
)

// errLeadershipLost is what lead returns when the election's lease
// expired under it.
var errLeadershipLost = errors.New("lease expired")

// leadUntilDone is the life of each of the package's workers (the
// controller, retention, the usage accountant), until ctx ends: campaign
// in the etcd election elections/<name> under keys' prefix, run work
// while this process leads, and campaign again a second after the
// leadership was lost.
//
// work's context ends when ctx does or when the election's lease expires,
// so a worker that lost the leadership stops writing; work returns nil
// when its context ends and an error when it cannot go on.
func leadUntilDone(ctx context.Context, cli *clientv3.Client, keys state.Keys, name string, log *slog.Logger, work func(context.Context) error) {
	for ctx.Err() == nil {
		if err := leadOnce(ctx, cli, keys, name, work); err != nil && ctx.Err() == nil {
			log.Warn(name+" leadership lost; campaigning again", "err", err)
			ctxwait.Sleep(ctx, time.Second)
		}
	}
}

// leadOnce campaigns once and runs work while this process leads; it resigns
// when work returns.
func leadOnce(ctx context.Context, cli *clientv3.Client, keys state.Keys, name string, work func(context.Context) error) error {
	s, err := elect(ctx, cli, keys, name)
	if err != nil {
		return err
	}
	defer resign(cli, s)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.Ctx(), cancel)
	defer stop()
	err = work(wctx)
	if ctx.Err() == nil && s.Ctx().Err() != nil {
		return errLeadershipLost
	}
	return err
}

// elect campaigns in the etcd election elections/<name> under keys'
// prefix and returns, once this process leads, the session whose lease
// holds the leadership: it is lost when the session's Done closes. The
// caller closes the session to resign.
func elect(ctx context.Context, cli *clientv3.Client, keys state.Keys, name string) (*concurrency.Session, error) {
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(10), concurrency.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("create %s lease: %w", name, err)
	}
	host, _ := os.Hostname()
	if err := concurrency.NewElection(s, keys.Elections()+name).Campaign(ctx, host); err != nil {
		resign(cli, s)
		return nil, fmt.Errorf("campaign for %s: %w", name, err)
	}
	return s, nil
}

// resign ends session s and revokes its lease, which deletes its election
// key, so another process leads at once. The revoke has a context of its
// own: the session's is the caller's, ended by an orderly stop, and
// Session.Close's revoke under it failed, so the leadership passed only
// when the lease's TTL (10 s) ran out.
func resign(cli *clientv3.Client, s *concurrency.Session) {
	s.Orphan()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = cli.Revoke(ctx, s.Lease())
}
