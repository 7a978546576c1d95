package placer

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// SharedCaches are the watch caches of cluster state that a placer and the
// lifecycle controller of one process both read (the queue, nodes, ledgers,
// cordons, quotas and warnings), so the process lists and holds each prefix
// once: at 100,000 queued sessions and 10,000 nodes, a second copy of each
// cost hundreds of MiB and doubled the time to list them (issue 16 (d)).
// Build it first, hand it to placer.Config and the controller's config
// (they add their handlers while they are built), then run it beside them
// with Run.
type SharedCaches struct {
	Pending  *watcher.Cache[state.QueueEntry]
	Nodes    *watcher.Cache[state.Node]
	Ledgers  *watcher.Cache[state.Ledger]
	Cordons  *watcher.Cache[state.Cordon]
	Quotas   *watcher.Cache[state.Quota]
	Warnings *watcher.Cache[state.Warning]

	// sent are the ledger values the process's placer has sent, which
	// the ledgers cache takes as they were encoded instead of decoding
	// them (the placer that is built last, if several share the caches).
	sent atomic.Pointer[ownWrites]
}

// NewSharedCaches builds the caches over cli under k, logging to log (nil:
// slog.Default()). They do nothing until Run.
func NewSharedCaches(cli *clientv3.Client, k state.Keys, log *slog.Logger) *SharedCaches {
	if log == nil {
		log = slog.Default()
	}
	wopt := func(name string) watcher.Options { return watcher.Options{Name: name, Logger: log} }
	s := &SharedCaches{
		Pending:  watcher.New(cli, k.PendingDir(), decodeQueueEntry(k), wopt("pending")),
		Nodes:    watcher.New(cli, k.Nodes(), decodeNode, wopt("nodes")),
		Cordons:  watcher.New(cli, k.Cordons(), watcher.JSON[state.Cordon], wopt("cordons")),
		Quotas:   watcher.New(cli, k.Quotas(), watcher.JSON[state.Quota], wopt("quotas")),
		Warnings: watcher.New(cli, k.Warnings(), watcher.JSON[state.Warning], wopt("warnings")),
	}
	s.Ledgers = watcher.New(cli, k.Ledgers(), s.decodeLedger, wopt("ledgers"))
	return s
}

// decodeLedger decodes a ledger value; one the placer sent, byte for byte,
// it takes as the placer encoded it. A burst rewrites each node's ledger,
// and each comes back through this cache: a placer alone decoded every
// ledger it had just written (about a tenth of its CPU in a burst).
func (s *SharedCaches) decodeLedger(key string, value []byte) (state.Ledger, error) {
	if o := s.sent.Load(); o != nil {
		if l, ok := o.sentLedger(key, value); ok {
			return l, nil
		}
	}
	return decodeLedger(key, value)
}

// runs lists the caches' Run methods.
func (s *SharedCaches) runs() []func(context.Context) error {
	return []func(context.Context) error{s.Pending.Run, s.Nodes.Run, s.Ledgers.Run, s.Cordons.Run, s.Quotas.Run, s.Warnings.Run}
}

// Run keeps every cache current until ctx ends (then it returns nil) or
// one fails (then it stops the others and returns that failure).
func (s *SharedCaches) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 6)
	for _, run := range s.runs() {
		wg.Go(func() {
			if err := run(ctx); err != nil {
				errc <- err
				cancel()
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		return fmt.Errorf("run shared caches: %w", err)
	}
	return nil
}
