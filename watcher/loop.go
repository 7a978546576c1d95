package watcher

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/ctxwait"
)

var (
	errWatchClosed = errors.New("watch channel closed")
	errOutOfStep   = errors.New("cache out of step with etcd")
)

// loop alternates full lists and watches until ctx ends.
func (c *Cache[T]) loop(ctx context.Context) {
	b := backoff{min: c.opts.BackoffMin, max: c.opts.BackoffMax}
	relist := true
	for ctx.Err() == nil {
		if relist {
			if err := c.relist(ctx); err != nil {
				if ctx.Err() != nil {
					return
				}
				d := b.next()
				c.log.Warn("list failed; retrying", "err", err, "retry_in", d)
				if !ctxwait.Sleep(ctx, d) {
					return
				}
				continue
			}
			relist = false
			b.reset()
		}
		var err error
		relist, err = c.watch(ctx, &b)
		if ctx.Err() != nil {
			return
		}
		if relist {
			c.log.Info("relisting", "reason", err, "revision", c.Revision())
			continue
		}
		d := b.next()
		c.log.Warn("watch stream broken; resuming", "err", err, "from_revision", c.Revision()+1, "retry_in", d)
		if !ctxwait.Sleep(ctx, d) {
			return
		}
	}
}

// watch follows the prefix from the cache's revision + 1 until the stream
// ends. It reports whether the cache must relist (the revision was compacted,
// or the cache found itself out of step) and why the stream ended.
func (c *Cache[T]) watch(ctx context.Context, b *backoff) (relist bool, err error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel() // releases the watch in the client
	from := c.Revision() + 1
	wch := c.cli.Watch(wctx, c.start,
		clientv3.WithRange(c.end),
		clientv3.WithRev(from),
		clientv3.WithProgressNotify(),
	)
	for {
		var resp clientv3.WatchResponse
		var ok bool
		select {
		case resp, ok = <-wch:
		case <-ctx.Done():
			return false, ctx.Err()
		}
		switch {
		case !ok:
			return false, errWatchClosed
		case resp.CompactRevision != 0:
			return true, fmt.Errorf("watch from revision %d: %w (compacted at %d)", from, rpctypes.ErrCompacted, resp.CompactRevision)
		case resp.Err() != nil:
			err := fmt.Errorf("watch from revision %d: %w", from, resp.Err())
			return errors.Is(err, rpctypes.ErrCompacted), err
		case len(resp.Events) > 0:
			if !c.applyWatch(ctx, resp.Events) {
				return true, errOutOfStep
			}
			b.reset()
		case resp.IsProgressNotify():
			c.progress(resp.Header.GetRevision())
			b.reset()
		}
	}
}

// progress records that the prefix has no change up to rev.
func (c *Cache[T]) progress(rev int64) {
	s := c.snap.Load()
	if rev <= s.rev {
		return
	}
	next := *s
	next.rev = rev // shards are immutable: share them
	c.snap.Store(&next)
}

// applyWatch applies one watch response's events as one batch, publishes the
// new snapshot, then delivers the events. It returns false when a key's
// version does not follow the one the cache holds (a missed change), which
// calls for a relist.
func (c *Cache[T]) applyWatch(ctx context.Context, evs []*clientv3.Event) (inStep bool) {
	base := c.snap.Load()
	b := newBuilder(base)
	out := make([]Event[T], 0, len(evs))
	rev := base.rev
	inStep = true
	for _, ev := range evs {
		kv := ev.Kv
		if kv.ModRevision <= base.rev {
			// Already applied (a resumed stream can only repeat what the
			// cache has, never skip): never deliver twice.
			continue
		}
		rev = kv.ModRevision
		key := string(kv.Key)
		old, had := b.item(key)
		if !c.agrees(key, ev, old) {
			inStep = false
		}
		if ev.Type == clientv3.EventTypeDelete {
			delete(c.bad, key)
			if had {
				b.del(key)
				out = append(out, deleted(*old, kv.ModRevision, false))
			}
			continue
		}
		v, err := c.decodeKV(key, kv)
		if err != nil {
			if had {
				b.del(key)
				out = append(out, deleted(*old, kv.ModRevision, false))
			}
			continue
		}
		it := &Item[T]{Key: key, Value: v, ModRevision: kv.ModRevision, CreateRevision: kv.CreateRevision, Version: kv.Version}
		b.set(it)
		out = append(out, changed(*it, old, false))
	}
	if !inStep {
		c.log.Error("a key's version from etcd does not follow the cache's (a missed change); relisting", "revision", rev)
	}
	c.snap.Store(b.build(rev))
	c.deliver(ctx, out)
	return inStep
}

// agrees checks an event against what the cache knew of its key: a put
// must be the key's next version (etcd counts a key's versions from 1 at
// its creation), one more than the version the cache holds, or 1 for a key
// it does not hold. A missed put, or a missed delete and create, shows as a
// version that does not follow. A delete needs no check: the key is gone
// whatever the cache missed before it. The watch asks for no previous
// values: etcd would read each one back from its store for every event of
// every watcher, and the version says as much.
func (c *Cache[T]) agrees(key string, ev *clientv3.Event, old *Item[T]) bool {
	if ev.Type == clientv3.EventTypeDelete {
		return true
	}
	var known int64
	if old != nil {
		known = old.Version
	} else if b, ok := c.bad[key]; ok {
		known = b.version
	}
	return ev.Kv.Version == known+1
}

// decodeKV decodes kv's value, recording a failure.
func (c *Cache[T]) decodeKV(key string, kv *mvccpb.KeyValue) (T, error) {
	v, err := c.decode(key, kv.Value)
	if err != nil {
		c.decodeErrors.Add(1)
		c.bad[key] = badValue{rev: kv.ModRevision, version: kv.Version}
		c.log.Warn("skipping value that does not decode", "key", key, "mod_revision", kv.ModRevision, "err", err)
		return v, err
	}
	delete(c.bad, key)
	return v, nil
}

// changed is the event of it replacing old (nil: it was added).
func changed[T any](it Item[T], old *Item[T], synthetic bool) Event[T] {
	ev := Event[T]{Type: Added, Key: it.Key, Value: it.Value, Revision: it.ModRevision, Synthetic: synthetic}
	if old != nil {
		prev := old.Value
		ev.Type, ev.Prev = Modified, &prev
	}
	return ev
}

func deleted[T any](old Item[T], rev int64, synthetic bool) Event[T] {
	prev := old.Value
	return Event[T]{Type: Deleted, Key: old.Key, Value: old.Value, Prev: &prev, Revision: rev, Synthetic: synthetic}
}

func (c *Cache[T]) deliver(ctx context.Context, evs []Event[T]) {
	for _, ev := range evs {
		c.deliverOne(ctx, ev)
	}
}

func (c *Cache[T]) deliverOne(ctx context.Context, ev Event[T]) {
	for _, sink := range c.sinks {
		sink(ctx, ev)
	}
}

// relist reads the whole prefix at one revision, replaces the cache with it
// and delivers the difference as synthetic events. Each page is decoded
// as it arrives and then dropped, so the raw list of a large prefix never
// sits in memory whole beside its decoded copy; nothing is published
// until the last page is in, and a list that fails part way leaves the
// cache as it was.
func (c *Cache[T]) relist(ctx context.Context) error {
	l := c.newListing()
	rev, err := c.list(ctx, l.add)
	if err != nil {
		return err
	}
	c.finishList(ctx, l, rev)
	return nil
}

// list reads the prefix page by page, every page at the first page's
// revision, handing each page to page before reading the next. It
// returns the revision read at.
func (c *Cache[T]) list(ctx context.Context, page func([]*mvccpb.KeyValue)) (int64, error) {
	var rev int64
	key := c.start
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(c.end), clientv3.WithLimit(c.opts.PageSize)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := c.cli.Get(ctx, key, opts...)
		if err != nil {
			return 0, fmt.Errorf("list prefix %q at revision %d: %w", c.prefix, rev, err)
		}
		if rev == 0 {
			rev = resp.Header.GetRevision()
		}
		page(resp.Kvs)
		if !resp.More || len(resp.Kvs) == 0 {
			return rev, nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// listChange is one change a list found, kept until the list is complete:
// the item now (nil: deleted) and the one before (nil: added).
type listChange[T any] struct {
	it, prev *Item[T]
	rev      int64
}

// listing is a list being applied: the next content, built page by page
// from the previous one, and the changes found so far.
type listing[T any] struct {
	c    *Cache[T]
	old  *Snapshot[T]
	b    *builder[T]
	bad  map[string]badValue
	out  []listChange[T]
	keys int
	info SyncInfo
}

func (c *Cache[T]) newListing() *listing[T] {
	old := c.snap.Load()
	return &listing[T]{c: c, old: old, b: newBuilder(emptySnapshot[T](old.seed)), bad: make(map[string]badValue),
		info: SyncInfo{Initial: !c.listed}}
}

// add applies one page of the list. A value unchanged since the previous
// content (same ModRevision) is not decoded again.
func (l *listing[T]) add(kvs []*mvccpb.KeyValue) {
	c := l.c
	l.keys += len(kvs)
	for _, kv := range kvs {
		key := string(kv.Key)
		prev, had := l.old.item(key)
		if had && prev.ModRevision == kv.ModRevision {
			l.b.set(prev)
			continue
		}
		if b, ok := c.bad[key]; ok && b.rev == kv.ModRevision {
			l.bad[key] = b // still the same undecodable value: counted already
			continue
		}
		v, err := c.decodeKV(key, kv)
		if err != nil {
			l.bad[key] = badValue{rev: kv.ModRevision, version: kv.Version}
			if had {
				l.out = append(l.out, listChange[T]{prev: prev, rev: kv.ModRevision})
				l.info.Deleted++
			}
			continue
		}
		it := &Item[T]{Key: key, Value: v, ModRevision: kv.ModRevision, CreateRevision: kv.CreateRevision, Version: kv.Version}
		l.b.set(it)
		l.out = append(l.out, listChange[T]{it: it, prev: prev, rev: kv.ModRevision})
		if had {
			l.info.Modified++
		} else {
			l.info.Added++
		}
	}
}

// finishList makes the cache equal to the listing, the prefix at rev, and
// delivers the difference from the previous content as synthetic events
// sorted by revision.
func (c *Cache[T]) finishList(ctx context.Context, l *listing[T], rev int64) {
	l.info.Revision = rev
	l.old.shards.each(func(m map[string]*Item[T]) bool {
		for key, it := range m {
			if _, ok := l.b.item(key); ok {
				continue
			}
			if _, ok := l.bad[key]; ok {
				continue // its Deleted is already out
			}
			l.out = append(l.out, listChange[T]{prev: it, rev: rev})
			l.info.Deleted++
		}
		return true
	})
	out := l.out
	key := func(ch listChange[T]) string {
		if ch.it != nil {
			return ch.it.Key
		}
		return ch.prev.Key
	}
	slices.SortFunc(out, func(a, b listChange[T]) int {
		return cmp.Or(cmp.Compare(a.rev, b.rev), strings.Compare(key(a), key(b)))
	})
	c.bad = l.bad
	c.snap.Store(l.b.build(rev))
	for i, ch := range out {
		if ch.it == nil {
			c.deliverOne(ctx, deleted(*ch.prev, ch.rev, true))
		} else {
			c.deliverOne(ctx, changed(*ch.it, ch.prev, true))
		}
		out[i] = listChange[T]{} // delivered: let the values go with the old content
	}
	info := l.info
	// A first list is routine (every start); a relist after a compaction
	// or a broken watch is worth seeing.
	level := slog.LevelDebug
	if !info.Initial {
		level = slog.LevelInfo
	}
	c.log.Log(ctx, level, "listed", "revision", rev, "keys", l.keys, "initial", info.Initial,
		"added", info.Added, "modified", info.Modified, "deleted", info.Deleted)
	for _, fn := range c.syncHooks {
		fn(info)
	}
	if c.listed {
		c.relists.Add(1)
	}
	if !c.listed {
		c.listed = true
		close(c.synced)
	}
}

// applyList makes the cache equal to kvs, the prefix at rev, as a list of
// one page would (tests and benchmarks feed it directly).
func (c *Cache[T]) applyList(ctx context.Context, rev int64, kvs []*mvccpb.KeyValue) {
	l := c.newListing()
	l.add(kvs)
	c.finishList(ctx, l, rev)
}
