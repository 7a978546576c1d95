package watcher

import (
	"fmt"
	"hash/maphash"
	"testing"
)

// RangeShared visits every item of a snapshot exactly once, handing the
// stored items themselves: the pointer Range would copy from, which a
// later snapshot sharing the item hands out too.
func TestRangeSharedHandsTheStoredItems(t *testing.T) {
	b := newBuilder(emptySnapshot[int](maphash.MakeSeed()))
	for i := range 1000 {
		b.set(&Item[int]{Key: fmt.Sprintf("k%04d", i), Value: i, ModRevision: int64(i + 1)})
	}
	first := b.build(1000)
	next := newBuilder(first)
	next.del("k0000")
	second := next.build(1001)

	seen := map[string]*Item[int]{}
	first.RangeShared(func(it *Item[int]) bool {
		if _, dup := seen[it.Key]; dup {
			t.Fatalf("%s visited twice", it.Key)
		}
		stored, _ := first.item(it.Key)
		if it != stored {
			t.Fatalf("%s: RangeShared handed a copy, not the stored item", it.Key)
		}
		seen[it.Key] = it
		return true
	})
	if len(seen) != 1000 {
		t.Fatalf("visited %d items, want 1000", len(seen))
	}
	n := 0
	second.RangeShared(func(it *Item[int]) bool {
		n++
		if seen[it.Key] != it {
			t.Fatalf("%s: the next snapshot does not share the unchanged item", it.Key)
		}
		return true
	})
	if n != 999 {
		t.Fatalf("the next snapshot visited %d items, want 999", n)
	}
	stops := 0
	first.RangeShared(func(*Item[int]) bool { stops++; return false })
	if stops != 1 {
		t.Fatalf("RangeShared went on after fn returned false (%d calls)", stops)
	}
}
