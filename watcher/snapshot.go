package watcher

import (
	"hash/maphash"
	"maps"
	"slices"
	"strings"
)

// A snapshot's items are split over shardCount maps, held in groupCount
// groups of groupSize. A batch of changes copies the top level (groupCount
// pointers), each group it touches (groupSize pointers) and each map it
// touches, and shares the rest with the snapshot before it. At 20,000 keys
// a map holds about 5 entries, at 100,000 about 25: a batch of 36 deletions
// (one bind transaction's queue entries) copies about a thousand entries,
// where 256 flat maps copied 14,000 at 100,000 keys, and a batch of one
// change copies a few hundred pointers, where 4,096 flat maps copied 4,096
// (BenchmarkCacheApply).
const (
	groupCount = 64
	groupSize  = 64 // a builder keeps a 64-bit word per group
	shardCount = groupCount * groupSize
)

// shards hold each item behind a pointer: copying a map then copies a key
// and a pointer per entry, never the value, so snapshots still held by
// readers share every unchanged item with the newest one. A nil group has
// only empty maps.
type shards[T any] [groupCount]*group[T]

type group[T any] [groupSize]map[string]*Item[T]

// shard returns map i (nil when empty).
func (sh *shards[T]) shard(i int) map[string]*Item[T] {
	g := sh[i/groupSize]
	if g == nil {
		return nil
	}
	return g[i%groupSize]
}

// each calls fn for every non-empty map until fn returns false.
func (sh *shards[T]) each(fn func(map[string]*Item[T]) bool) {
	for _, g := range sh {
		if g == nil {
			continue
		}
		for _, m := range g {
			if len(m) > 0 && !fn(m) {
				return
			}
		}
	}
}

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
	if it, ok := s.shards.shard(shardOf(s.seed, key))[key]; ok {
		return *it, true
	}
	return Item[T]{}, false
}

// item returns key's stored item, nil if absent: shared, never modify it.
func (s *Snapshot[T]) item(key string) (*Item[T], bool) {
	if s.shards == nil {
		return nil, false
	}
	it, ok := s.shards.shard(shardOf(s.seed, key))[key]
	return it, ok
}

// Range calls fn for every item, in no particular order, until fn returns
// false. It is List without the copy and the sort, for readers that order
// items themselves.
func (s *Snapshot[T]) Range(fn func(Item[T]) bool) {
	if s.shards == nil {
		return
	}
	s.shards.each(func(m map[string]*Item[T]) bool {
		for _, it := range m {
			if !fn(*it) {
				return false
			}
		}
		return true
	})
}

// RangeShared is Range handing fn the stored items themselves instead of
// copies: for a reader that keeps pointers to values (a planning snapshot
// of 100,000 queue entries) without copying each. The items are shared
// with the cache and every snapshot: never modify one.
func (s *Snapshot[T]) RangeShared(fn func(*Item[T]) bool) {
	if s.shards == nil {
		return
	}
	s.shards.each(func(m map[string]*Item[T]) bool {
		for _, it := range m {
			if !fn(it) {
				return false
			}
		}
		return true
	})
}

// List returns every item, sorted by key. The slice is new and the
// caller's to keep.
func (s *Snapshot[T]) List() []Item[T] {
	out := make([]Item[T], 0, s.n)
	if s.shards == nil {
		return out
	}
	s.shards.each(func(m map[string]*Item[T]) bool {
		for _, it := range m {
			out = append(out, *it)
		}
		return true
	})
	slices.SortFunc(out, func(a, b Item[T]) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// builder makes the next snapshot from a base one, copying a group and a
// map the first time the batch writes to them and sharing the others.
type builder[T any] struct {
	seed   maphash.Seed
	n      int
	shards *shards[T]
	// owned has a bit per map the builder copied, a word per group
	// (groupSize is 64): a group with none is still the base's.
	owned [groupCount]uint64
}

func newBuilder[T any](base *Snapshot[T]) *builder[T] {
	sh := *base.shards
	return &builder[T]{seed: base.seed, n: base.n, shards: &sh}
}

// item returns key's item in the snapshot being built, nil if absent.
func (b *builder[T]) item(key string) (*Item[T], bool) {
	it, ok := b.shards.shard(shardOf(b.seed, key))[key]
	return it, ok
}

// own returns map i for writing: the builder's own copy.
func (b *builder[T]) own(i int) map[string]*Item[T] {
	gi, mi := i/groupSize, i%groupSize
	if b.owned[gi] == 0 {
		g := new(group[T])
		if old := b.shards[gi]; old != nil {
			*g = *old
		}
		b.shards[gi] = g
	}
	g := b.shards[gi]
	if b.owned[gi]&(1<<mi) == 0 {
		m := maps.Clone(g[mi]) // much faster than inserting one by one
		if m == nil {
			m = make(map[string]*Item[T])
		}
		g[mi] = m
		b.owned[gi] |= 1 << mi
	}
	return g[mi]
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
	if _, ok := b.shards.shard(i)[key]; !ok {
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
