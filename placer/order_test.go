package placer

import (
	"fmt"
	"math/rand"
	"slices"
	"testing"
	"time"
)

// TestByAgeMatchesComparisonSort: byAge's groups come out in
// olderFirstKey's order, whether its radix sort (ageOrder) or the
// comparison sort it falls back to orders them, on queues built to
// stress each: many requests of one age (ties broken by id, whatever the
// queue's order), ages a nanosecond apart, ages spread over days, zero
// times among real ones (too far apart for the radix sort), several
// priorities and owners, and an empty queue. Every request is in
// exactly one group, and each group holds only its key's requests.
func TestByAgeMatchesComparisonSort(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	type shape struct {
		name  string
		n     int
		when  func(i int) time.Time
		radix bool // ageOrder sorts it
	}
	shapes := []shape{
		{"empty", 0, nil, false},
		{"one age", 300, func(int) time.Time { return t0 }, true},
		{"few ages", 2000, func(int) time.Time { return t0.Add(-time.Duration(rng.Intn(5)) * time.Second) }, true},
		{"nanoseconds", 2000, func(int) time.Time { return t0.Add(-time.Duration(rng.Intn(3000))) }, true},
		{"an hour", 5000, func(int) time.Time { return t0.Add(-time.Duration(rng.Int63n(int64(time.Hour)))) }, true},
		{"days", 3000, func(int) time.Time { return t0.Add(-time.Duration(rng.Int63n(int64(90 * 24 * time.Hour)))) }, true},
		{"centuries", 500, func(int) time.Time { return t0.AddDate(-rng.Intn(500), 0, 0).Add(time.Duration(rng.Intn(1000))) }, true},
		{"zero times", 1000, func(i int) time.Time {
			if i%10 == 0 {
				return time.Time{}
			}
			return t0.Add(-time.Duration(rng.Intn(600)) * time.Second)
		}, false},
	}
	for _, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			s := &Snapshot{Now: t0}
			for i := 0; i < sh.n; i++ {
				p := req(fmt.Sprintf("s%07d-%d", rng.Intn(10_000_000), i), fmt.Sprintf("u%d", rng.Intn(4)), 1, 0)
				p.Entry.Created = sh.when(i)
				p.Entry.Priority = rng.Intn(2)
				p.Pinned = rng.Intn(20) == 0
				s.Pending = append(s.Pending, p)
			}
			rng.Shuffle(len(s.Pending), func(i, j int) { s.Pending[i], s.Pending[j] = s.Pending[j], s.Pending[i] })
			p := &planner{snap: s, buf: new(passBuffers)}
			var keys []ageKey
			for i := range s.Pending {
				e := s.Pending[i].Entry
				keys = append(keys, ageKey{sec: e.Created.Unix(), nsec: int32(e.Created.Nanosecond()), id: e.Session})
			}
			if got := p.ageOrder(keys) != nil; got != sh.radix {
				t.Fatalf("ageOrder sorts it: %v, want %v", got, sh.radix)
			}
			seen := 0
			for _, ag := range p.byAge() {
				want := slices.Clone(ag.keys)
				slices.SortFunc(want, olderFirstKey)
				for i := range ag.keys {
					k := ag.keys[i]
					if k.id != want[i].id {
						t.Fatalf("group %+v, place %d: %s, want %s", ag.key, i, k.id, want[i].id)
					}
					e := k.it.Entry
					if (holdKey{e.Priority, e.Team, e.Owner, ""}) != ag.key || s.Pending[k.idx].Entry != e {
						t.Fatalf("group %+v holds %s (priority %d, owner %s) at index %d", ag.key, e.Session, e.Priority, e.Owner, k.idx)
					}
				}
				seen += len(ag.keys)
			}
			if seen != sh.n {
				t.Fatalf("groups hold %d requests, want %d", seen, sh.n)
			}
		})
	}
}
