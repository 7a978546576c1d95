package watcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Client is what a Cache needs of etcd. *clientv3.Client satisfies it.
type Client interface {
	Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error)
	Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan
}

var _ Client = (*clientv3.Client)(nil)

// badValue is the revision and version of a key's value that does not
// decode.
type badValue struct{ rev, version int64 }

// DecodeFunc turns a stored value into T. It is called once per change of a
// key, from the cache's goroutine; value is not reused by the cache and may
// be retained. An error makes the cache treat the key as absent.
type DecodeFunc[T any] func(key string, value []byte) (T, error)

// JSON is a DecodeFunc for values stored as JSON.
func JSON[T any](key string, value []byte) (T, error) {
	var v T
	if err := json.Unmarshal(value, &v); err != nil {
		return v, fmt.Errorf("decode %s: %w", key, err)
	}
	return v, nil
}

// ErrStarted is returned by Run when the cache was already run.
var ErrStarted = errors.New("cache already started")

// ErrStopped is returned by WaitSynced when Run returned before the first
// list was applied. Run returns only when its context ends, so the error
// also wraps that context's error (context.Canceled or
// context.DeadlineExceeded): a reader of a cache that another component
// runs can tell that the cache was stopped by a shutdown, even before its
// own context hears of it.
var ErrStopped = errors.New("cache stopped before its first sync")

// Cache is a typed copy of one etcd prefix, kept current by Run.
//
// Register handlers, subscribers and hooks, then call Run once. Reading
// (Snapshot, Get, List, Len, Revision, DecodeErrors, Relists) is safe from
// any goroutine at any time. Values are stored and handed out by value and
// shared between snapshots: for a large T use a pointer type, and never
// modify what it points to.
type Cache[T any] struct {
	cli        Client
	prefix     string
	start, end string // the range read and watched: [start, end)
	decode     DecodeFunc[T]
	opts       Options
	log        *slog.Logger

	snap         atomic.Pointer[Snapshot[T]]
	decodeErrors atomic.Int64
	relists      atomic.Int64
	synced       chan struct{}
	done         chan struct{}
	stopped      error // why Run returned: its context's error; set before done is closed

	mu        sync.Mutex // guards the fields below until Run starts
	started   bool
	sinks     []func(context.Context, Event[T])
	subs      []chan Event[T]
	syncHooks []func(SyncInfo)

	// Owned by Run's goroutine.
	bad    map[string]badValue // keys whose current value does not decode
	listed bool
}

// New returns a cache of the keys under prefix, decoding values with decode.
// It does nothing until Run. It panics if cli or decode is nil.
func New[T any](cli Client, prefix string, decode DecodeFunc[T], opts Options) *Cache[T] {
	if cli == nil || decode == nil {
		panic("watcher.New: nil client or decode func")
	}
	opts = opts.withDefaults(prefix)
	start, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
	if start == "" {
		// etcd refuses an empty key; "\x00" up to "\x00" means every key.
		start = "\x00"
	}
	c := &Cache[T]{
		cli:    cli,
		prefix: prefix,
		start:  start,
		end:    end,
		decode: decode,
		opts:   opts,
		log:    opts.Logger.With("watcher", opts.Name, "prefix", prefix),
		synced: make(chan struct{}),
		done:   make(chan struct{}),
		bad:    map[string]badValue{},
	}
	c.snap.Store(emptySnapshot[T](maphash.MakeSeed()))
	return c
}

// AddHandler registers fn to be called for every change.
//
// The contract: fn is called from Run's goroutine only, one event at a time,
// in revision order (events of one revision in etcd's order; the synthetic
// events of a list by revision, then key), exactly once per change the cache
// applies, and after the cache has applied that change and the rest of its
// batch (all events of one watch response, or all changes found by one
// list): during fn, Snapshot().Revision() is at least ev.Revision. After a
// relist the changes are the net ones (see the package doc). Handlers run in
// registration order; a slow handler delays every later change, so hand long
// work to another goroutine. The events of the first list are delivered as
// synthetic Added events before Synced is closed.
//
// AddHandler panics if Run has started.
func (c *Cache[T]) AddHandler(fn func(Event[T])) {
	c.register(func() {
		c.sinks = append(c.sinks, func(_ context.Context, ev Event[T]) { fn(ev) })
	})
}

// Subscribe returns a channel that receives every change, with the same
// order and exactly-once contract as a handler. Run's goroutine sends on it
// and closes it when Run returns; an event not yet received when Run's ctx
// ends is dropped. A send blocks until the subscriber receives (after buffer
// events are queued), stalling the whole cache: keep reading until the
// channel is closed.
//
// Subscribe panics if Run has started.
func (c *Cache[T]) Subscribe(buffer int) <-chan Event[T] {
	ch := make(chan Event[T], buffer)
	c.register(func() {
		c.subs = append(c.subs, ch)
		c.sinks = append(c.sinks, func(ctx context.Context, ev Event[T]) {
			select {
			case ch <- ev:
			case <-ctx.Done():
			}
		})
	})
	return ch
}

// OnSync registers fn to be called from Run's goroutine after every full list
// has been applied and its events delivered: the first list and every relist.
// A consumer that keeps derived state can use it to re-check that state.
//
// OnSync panics if Run has started.
func (c *Cache[T]) OnSync(fn func(SyncInfo)) {
	c.register(func() { c.syncHooks = append(c.syncHooks, fn) })
}

func (c *Cache[T]) register(add func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		panic("watcher: register a handler, subscriber or hook before Run")
	}
	add()
}

// Snapshot returns the current content. It is cheap (no copy) and the result
// never changes.
func (c *Cache[T]) Snapshot() *Snapshot[T] { return c.snap.Load() }

// Get returns the current value of key and whether it is present.
func (c *Cache[T]) Get(key string) (T, bool) { return c.Snapshot().Get(key) }

// List returns the current items sorted by key.
func (c *Cache[T]) List() []Item[T] { return c.Snapshot().List() }

// Len returns the current number of keys.
func (c *Cache[T]) Len() int { return c.Snapshot().Len() }

// Revision returns the etcd revision the cache reflects (0 before the first
// list).
func (c *Cache[T]) Revision() int64 { return c.Snapshot().Revision() }

// DecodeErrors counts values that failed to decode since New: each
// (key, revision) once.
func (c *Cache[T]) DecodeErrors() int64 { return c.decodeErrors.Load() }

// Relists counts the full lists after the first one that have been applied,
// delivered and reported to OnSync hooks.
func (c *Cache[T]) Relists() int64 { return c.relists.Load() }

// Synced returns a channel closed once the first list is applied and its
// events delivered.
func (c *Cache[T]) Synced() <-chan struct{} { return c.synced }

// WaitSynced waits until the first list is applied and its events delivered.
// It fails if ctx ends first, or if Run returns first.
func (c *Cache[T]) WaitSynced(ctx context.Context) error {
	select {
	case <-c.synced:
		return nil
	case <-c.done:
		select {
		case <-c.synced:
			return nil
		default:
			if c.stopped == nil {
				return fmt.Errorf("wait for sync of %s: %w", c.opts.Name, ErrStopped)
			}
			return fmt.Errorf("wait for sync of %s: %w (%w)", c.opts.Name, ErrStopped, c.stopped)
		}
	case <-ctx.Done():
		return fmt.Errorf("wait for sync of %s: %w", c.opts.Name, ctx.Err())
	}
}

// Run lists the prefix, then keeps the cache current until ctx ends, and
// returns nil then. Failures of etcd (unreachable, no leader, compaction)
// are retried, never returned. Subscriber channels are closed before Run
// returns. Run may be called once; later calls return ErrStarted.
func (c *Cache[T]) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.started {
		c.mu.Unlock()
		return fmt.Errorf("run cache %s: %w", c.opts.Name, ErrStarted)
	}
	c.started = true
	c.mu.Unlock()
	defer close(c.done)
	defer func() {
		for _, ch := range c.subs {
			close(ch)
		}
	}()
	c.loop(ctx)
	c.stopped = ctx.Err()
	return nil
}
