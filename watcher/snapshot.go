package watcher

import (
	"hash/maphash"
	"maps"
	"slices"
	"strings"
)

// shardCount is how many maps a snapshot is split into. A batch of changes
// copies only the shards it touches (plus this many pointers), so at 20,000
// keys one change copies about 80 entries instead of 20,000.
const shardCount = 256

// shards hold each item behind a pointer: copying a shard then copies a
// key and a pointer per entry, never the value, so a batch that touches
// every shard of 100,000 large values (a round of binds deleting queue
// entries) copies megabytes rather than tens of them, and snapshots still
// held by readers share every unchanged item with the newest one.
type shards[T any] [shardCount]map[string]*Item[T]

// Snapshot is the cache's content at one revision, as returned by
// Cache.Snapshot. It never changes after the cache publishes it: keep it as
// long as needed and read it from any number of goroutines without locking.
// Values are shared with the cache and with other snapshots, so treat them
// (and anything they point to) as read-only. The zero Snapshot is empty.
type Snapshot[T any] struct {
	rev    int64
	n      int
	seed   maphash.Seed
	shards *shards[T]
}

func emptySnapshot[T any](seed maphash.Seed) *Snapshot[T] {
	return &Snapshot[T]{seed: seed, shards: new(shards[T])}
}

func shardOf(seed maphash.Seed, key string) int {
	return int(maphash.String(seed, key) % shardCount)
}

// Revision is the etcd revision this snapshot reflects: every change to the
// prefix up to and including it is applied, none after it. It is 0 before
// the first list.
func (s *Snapshot[T]) Revision() int64 { return s.rev }

// Len is the number of keys.
func (s *Snapshot[T]) Len() int { return s.n }

// Get returns the value of key and whether the key is present.
func (s *Snapshot[T]) Get(key string) (T, bool) {
	it, ok := s.Item(key)
	return it.Value, ok
}

// Item returns key's value with its revisions, and whether it is present.
func (s *Snapshot[T]) Item(key string) (Item[T], bool) {
	if s.shards == nil {
		return Item[T]{}, false
	}
	if it, ok := s.shards[shardOf(s.seed, key)][key]; ok {
		return *it, true
	}
	return Item[T]{}, false
}

// item returns key's stored item, nil if absent: shared, never modify it.
func (s *Snapshot[T]) item(key string) (*Item[T], bool) {
	if s.shards == nil {
		return nil, false
	}
	it, ok := s.shards[shardOf(s.seed, key)][key]
	return it, ok
}

// Range calls fn for every item, in no particular order, until fn returns
// false. It is List without the copy and the sort, for readers that order
// items themselves.
func (s *Snapshot[T]) Range(fn func(Item[T]) bool) {
	if s.shards == nil {
		return
	}
	for _, m := range s.shards {
		for _, it := range m {
			if !fn(*it) {
				return
			}
		}
	}
}

// RangeShared is Range handing fn the stored items themselves instead of
// copies: for a reader that keeps pointers to values (a planning snapshot
// of 100,000 queue entries) without copying each. The items are shared
// with the cache and every snapshot: never modify one.
func (s *Snapshot[T]) RangeShared(fn func(*Item[T]) bool) {
	if s.shards == nil {
		return
	}
	for _, m := range s.shards {
		for _, it := range m {
			if !fn(it) {
				return
			}
		}
	}
}

// List returns every item, sorted by key. The slice is new and the
// caller's to keep.
func (s *Snapshot[T]) List() []Item[T] {
	out := make([]Item[T], 0, s.n)
	if s.shards == nil {
		return out
	}
	for _, m := range s.shards {
		for _, it := range m {
			out = append(out, *it)
		}
	}
	slices.SortFunc(out, func(a, b Item[T]) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// builder makes the next snapshot from a base one, copying a shard the first
// time the batch writes to it and sharing the others.
type builder[T any] struct {
	seed   maphash.Seed
	n      int
	shards *shards[T]
	owned  [shardCount]bool
}

func newBuilder[T any](base *Snapshot[T]) *builder[T] {
	sh := *base.shards
	return &builder[T]{seed: base.seed, n: base.n, shards: &sh}
}

// item returns key's item in the snapshot being built, nil if absent.
func (b *builder[T]) item(key string) (*Item[T], bool) {
	it, ok := b.shards[shardOf(b.seed, key)][key]
	return it, ok
}

func (b *builder[T]) own(i int) map[string]*Item[T] {
	if !b.owned[i] {
		m := maps.Clone(b.shards[i]) // much faster than inserting one by one
		if m == nil {
			m = make(map[string]*Item[T])
		}
		b.shards[i] = m
		b.owned[i] = true
	}
	return b.shards[i]
}

func (b *builder[T]) set(it *Item[T]) {
	m := b.own(shardOf(b.seed, it.Key))
	if _, ok := m[it.Key]; !ok {
		b.n++
	}
	m[it.Key] = it
}

func (b *builder[T]) del(key string) {
	i := shardOf(b.seed, key)
	if _, ok := b.shards[i][key]; !ok {
		return
	}
	delete(b.own(i), key)
	b.n--
}

// build returns the snapshot at rev. The builder must not be used after.
func (b *builder[T]) build(rev int64) *Snapshot[T] {
	s := &Snapshot[T]{rev: rev, n: b.n, seed: b.seed, shards: b.shards}
	b.shards = nil
	return s
}
