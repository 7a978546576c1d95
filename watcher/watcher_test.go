package watcher_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdembed"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/watcher"
)

func mustJSON(v string) string {
	b, _ := json.Marshal(val{V: v})
	return string(b)
}

// checkEqualsEtcd fails unless snap holds exactly what etcd holds under
// prefix: keys, values and revisions.
func checkEqualsEtcd(t *testing.T, cli *clientv3.Client, prefix string, snap *watcher.Snapshot[val]) {
	t.Helper()
	resp, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("get prefix: %v", err)
	}
	var want []watcher.Item[val]
	for _, kv := range resp.Kvs {
		var v val
		if err := json.Unmarshal(kv.Value, &v); err != nil {
			continue // undecodable values are absent from the cache
		}
		want = append(want, watcher.Item[val]{Key: string(kv.Key), Value: v, ModRevision: kv.ModRevision, CreateRevision: kv.CreateRevision, Version: kv.Version})
	}
	got := snap.List()
	if !reflect.DeepEqual(got, want) && !(len(got) == 0 && len(want) == 0) {
		t.Fatalf("cache differs from etcd:\n got %d items %v\nwant %d items %v", len(got), got, len(want), want)
	}
	if snap.Len() != len(want) {
		t.Fatalf("Len() = %d, want %d", snap.Len(), len(want))
	}
}

// pagingKV counts list requests and runs a hook after the first one.
type pagingKV struct {
	clientv3.KV
	gets       atomic.Int64
	firstRev   atomic.Int64
	afterFirst func()
}

func (p *pagingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := p.KV.Get(ctx, key, opts...)
	if err == nil && p.gets.Add(1) == 1 {
		p.firstRev.Store(resp.Header.Revision)
		p.afterFirst()
	}
	return resp, err
}

func TestListPagesAtOneRevision(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	const n, pageSize = 2500, 100
	for i := 0; i < n; i += 100 {
		ops := make([]clientv3.Op, 0, 100)
		for j := i; j < i+100; j++ {
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("/p/k%04d", j), mustJSON(fmt.Sprint(j))))
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	// Between the first page and the rest, change the end of the range:
	// later pages must still read the first page's revision.
	kv := &pagingKV{KV: cli, afterFirst: func() {
		if _, err := cli.Put(ctx, "/p/zzz", mustJSON("late")); err != nil {
			t.Error(err)
		}
		if _, err := cli.Delete(ctx, "/p/k2499"); err != nil {
			t.Error(err)
		}
	}}
	opts := testOptions(t)
	opts.PageSize = pageSize
	c := watcher.New(struct {
		clientv3.KV
		clientv3.Watcher
	}{kv, cli}, "/p/", watcher.JSON[val], opts)
	var (
		atSync   *watcher.Snapshot[val]
		syncInfo watcher.SyncInfo
		added    atomic.Int64
	)
	c.OnSync(func(info watcher.SyncInfo) {
		if info.Initial {
			atSync, syncInfo = c.Snapshot(), info
		}
	})
	c.AddHandler(func(ev watcher.Event[val]) {
		if ev.Synthetic && ev.Type == watcher.Added {
			added.Add(1)
		}
	})
	run(t, c)

	if got := kv.gets.Load(); got != n/pageSize {
		t.Errorf("list took %d requests, want %d pages", got, n/pageSize)
	}
	if atSync.Len() != n || added.Load() != n || syncInfo.Added != n {
		t.Errorf("first list: Len %d, Added events %d, SyncInfo.Added %d; want %d", atSync.Len(), added.Load(), syncInfo.Added, n)
	}
	if atSync.Revision() != kv.firstRev.Load() || syncInfo.Revision != kv.firstRev.Load() {
		t.Errorf("first list revision %d (SyncInfo %d), want the first page's %d", atSync.Revision(), syncInfo.Revision, kv.firstRev.Load())
	}
	if _, ok := atSync.Get("/p/k2499"); !ok {
		t.Errorf("first list misses /p/k2499, deleted after the first page")
	}
	if _, ok := atSync.Get("/p/zzz"); ok {
		t.Errorf("first list has /p/zzz, written after the first page")
	}
	// Range visits exactly what List holds, and stops when told.
	ranged := map[string]bool{}
	atSync.Range(func(it watcher.Item[val]) bool { ranged[it.Key] = true; return true })
	for _, it := range atSync.List() {
		if !ranged[it.Key] {
			t.Errorf("Range missed %s", it.Key)
		}
	}
	if len(ranged) != n {
		t.Errorf("Range visited %d items, want %d", len(ranged), n)
	}
	visits := 0
	atSync.Range(func(watcher.Item[val]) bool { visits++; return visits < 3 })
	if visits != 3 {
		t.Errorf("Range went on after fn returned false: %d visits", visits)
	}
	// The watch then brings both changes.
	caughtUp(t, cli, c)
	checkEqualsEtcd(t, cli, "/p/", c.Snapshot())
	if v, ok := c.Get("/p/zzz"); !ok || v.V != "late" {
		t.Errorf("Get(/p/zzz) = %v, %v after watch", v, ok)
	}
}

// pageLossKV fails one list request, the fail-th, once.
type pageLossKV struct {
	clientv3.KV
	gets   atomic.Int64
	fail   int64
	before func() // runs instead of that request
}

func (f *pageLossKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if f.gets.Add(1) == f.fail {
		f.before()
		return nil, errors.New("injected: list page lost")
	}
	return f.KV.Get(ctx, key, opts...)
}

// A list is decoded page by page, yet one that fails part way publishes
// nothing and delivers nothing: the next list starts over, every key is
// delivered once, and a value that does not decode is counted once.
func TestListFailingPartWayLeavesNoTrace(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	const n, pageSize = 500, 100
	ops := make([]clientv3.Op, 0, n)
	for i := range n {
		v := mustJSON(fmt.Sprint(i))
		if i == 5 {
			v = "{not json" // on the first page, decoded before the failure
		}
		ops = append(ops, clientv3.OpPut(fmt.Sprintf("/f/k%04d", i), v))
	}
	for i := 0; i < n; i += 100 {
		if _, err := cli.Txn(ctx).Then(ops[i : i+100]...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	var c *watcher.Cache[val]
	var atFailure int
	kv := &pageLossKV{KV: cli, fail: 3, before: func() { atFailure = c.Len() + int(c.Revision()) }}
	opts := testOptions(t)
	opts.PageSize = pageSize
	c = watcher.New(struct {
		clientv3.KV
		clientv3.Watcher
	}{kv, cli}, "/f/", watcher.JSON[val], opts)
	seen := map[string]int{}
	c.AddHandler(func(ev watcher.Event[val]) { seen[ev.Key]++ })
	run(t, c)

	if atFailure != 0 {
		t.Errorf("the cache published part of a list before it failed (keys + revision %d)", atFailure)
	}
	if got := kv.gets.Load(); got != 3+n/pageSize {
		t.Errorf("%d list requests, want 2 pages, the failed one, then %d pages", got, n/pageSize)
	}
	if len(seen) != n-1 {
		t.Errorf("events for %d keys, want %d", len(seen), n-1)
	}
	for key, times := range seen {
		if times != 1 {
			t.Errorf("%s delivered %d times", key, times)
		}
	}
	if got := c.DecodeErrors(); got != 1 {
		t.Errorf("DecodeErrors = %d, want 1 (the broken value counted once over both lists)", got)
	}
	checkEqualsEtcd(t, cli, "/f/", c.Snapshot())
}

// change is one write as the writer saw it.
type change struct {
	Key  string
	Rev  int64
	Type watcher.EventType
}

func sortChanges(cs []change) {
	slices.SortFunc(cs, func(a, b change) int {
		return cmp.Or(cmp.Compare(a.Rev, b.Rev), strings.Compare(a.Key, b.Key))
	})
}

// writer makes distinct changes to a few keys: puts, updates, deletes and
// multi-key transactions (several events at one revision).
type writer struct {
	cli    *clientv3.Client
	prefix string
	rng    *rand.Rand
	exists map[string]bool
	seq    int
	// pause, if set, is called every 100 changes; an error stops the writer.
	pause func() error
}

func newWriter(cli *clientv3.Client, prefix string) *writer {
	return &writer{cli: cli, prefix: prefix, rng: rand.New(rand.NewPCG(1, 2)), exists: map[string]bool{}}
}

func (w *writer) write(ctx context.Context, n int) ([]change, error) {
	var out []change
	putType := func(key string) watcher.EventType {
		if w.exists[key] {
			return watcher.Modified
		}
		w.exists[key] = true
		return watcher.Added
	}
	for i := range n {
		if w.pause != nil && i > 0 && i%100 == 0 {
			if err := w.pause(); err != nil {
				return out, err
			}
		}
		w.seq++
		key := fmt.Sprintf("%sk%02d", w.prefix, w.rng.IntN(30))
		switch r := w.rng.IntN(10); {
		case r == 0:
			keys := []string{key + "a", key + "b", key + "c"}
			ops := make([]clientv3.Op, len(keys))
			for i, k := range keys {
				ops[i] = clientv3.OpPut(k, mustJSON(fmt.Sprint(w.seq)))
			}
			resp, err := w.cli.Txn(ctx).Then(ops...).Commit()
			if err != nil {
				return out, err
			}
			for _, k := range keys {
				out = append(out, change{k, resp.Header.Revision, putType(k)})
			}
		case r < 4 && w.exists[key]:
			resp, err := w.cli.Delete(ctx, key)
			if err != nil {
				return out, err
			}
			delete(w.exists, key)
			out = append(out, change{key, resp.Header.Revision, watcher.Deleted})
		default:
			resp, err := w.cli.Put(ctx, key, mustJSON(fmt.Sprint(w.seq)))
			if err != nil {
				return out, err
			}
			out = append(out, change{key, resp.Header.Revision, putType(key)})
		}
	}
	return out, nil
}

// recorder keeps every event a handler saw.
type recorder struct {
	mu  sync.Mutex
	evs []watcher.Event[val]
}

func (r *recorder) handle(ev watcher.Event[val]) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evs = append(r.evs, ev)
}

func (r *recorder) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.evs)
}

func (r *recorder) events() []watcher.Event[val] {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.evs)
}

// checkExactlyOnce fails unless rec's handler has seen each wanted change
// once, in revision order, and nothing else. The cache publishes a
// watch response's snapshot before it delivers the response's events, so
// a cache at the current revision (caughtUp) may still be delivering the
// last batch: it first waits until the handler has seen as many events
// as there are changes (one delivered twice makes more, and fails the
// check all the same).
func checkExactlyOnce(t *testing.T, want []change, rec *recorder) {
	t.Helper()
	eventually(t, fmt.Sprintf("the handler to see %d changes (it saw %d)", len(want), rec.len()), func() bool { return rec.len() >= len(want) })
	got := rec.events()
	seen := map[change]bool{}
	var gotChanges []change
	var last int64
	for _, ev := range got {
		c := change{ev.Key, ev.Revision, ev.Type}
		if seen[c] {
			t.Errorf("delivered twice: %+v", c)
		}
		seen[c] = true
		if ev.Revision < last {
			t.Errorf("out of order: revision %d after %d", ev.Revision, last)
		}
		last = ev.Revision
		if ev.Synthetic {
			t.Errorf("unexpected synthetic event %+v", c)
		}
		gotChanges = append(gotChanges, c)
	}
	want = slices.Clone(want)
	sortChanges(want)
	sortChanges(gotChanges)
	if !slices.Equal(gotChanges, want) {
		t.Fatalf("handler saw %d changes, writer made %d; first difference at %s", len(gotChanges), len(want), firstDiff(gotChanges, want))
	}
}

func firstDiff(a, b []change) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("%d: got %+v, want %+v", i, a[i], b[i])
		}
	}
	return fmt.Sprintf("%d (one is a prefix of the other)", min(len(a), len(b)))
}

func TestStreamBreaksLoseAndRepeatNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode breakMode
	}{
		{"channel closed", closeStream},
		{"watch canceled", cancelStream},
		{"no leader", noLeaderStream},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli := etcdtest.New(t)
			fw := newFaultWatcher(cli)
			c := watcher.New(faultClient{cli, fw}, "/x/", watcher.JSON[val], testOptions(t))
			rec := &recorder{}
			c.AddHandler(rec.handle)
			run(t, c)

			type result struct {
				changes []change
				err     error
			}
			done := make(chan result, 1)
			broke := make(chan struct{}, 1)
			go func() {
				w := newWriter(cli, "/x/")
				// Every 100 changes, wait for one more break, so that
				// breaks happen mid-stream however fast this machine is.
				w.pause = func() error {
					select {
					case <-broke:
						return nil
					case <-time.After(20 * time.Second):
						return errors.New("no stream break within 20s")
					}
				}
				cs, err := w.write(context.Background(), 500)
				done <- result{cs, err}
			}()
			// Break the stream whenever it is open and has delivered
			// something since the last break, until the writer is done.
			var res result
			breaks, last := 0, 0
		loop:
			for {
				select {
				case res = <-done:
					break loop
				default:
				}
				if fw.active() > 0 && rec.len() > last {
					fw.breakAll(tc.mode)
					breaks++
					last = rec.len()
					select {
					case broke <- struct{}{}:
					default:
					}
				}
				time.Sleep(time.Millisecond) // poll interval
			}
			if res.err != nil {
				t.Fatalf("writer: %v", res.err)
			}
			if breaks < 4 {
				t.Fatalf("only %d stream breaks happened; the test proves nothing", breaks)
			}
			caughtUp(t, cli, c)
			checkExactlyOnce(t, res.changes, rec)
			checkEqualsEtcd(t, cli, "/x/", c.Snapshot())
			if c.Relists() != 0 {
				t.Errorf("Relists() = %d, want 0: a broken stream resumes, it does not relist", c.Relists())
			}
			t.Logf("%d changes, %d breaks, %d watches", len(res.changes), breaks, fw.watches.Load())
		})
	}
}

// TestServerRestartLosesAndRepeatsNothing stops etcd while the watcher follows
// it and starts it again on the same data and port. It drives etcdembed
// directly: etcdtest closes its server at cleanup, and embed's Close panics
// when called twice.
func TestServerRestartLosesAndRepeatsNothing(t *testing.T) {
	dir := t.TempDir()
	cfg := etcdembed.Config{Dir: dir, ClientAddr: etcdtest.FreeAddr(t), PeerAddr: etcdtest.FreeAddr(t), NoFsync: true}
	start := func() *etcdembed.Server {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s, err := etcdembed.Start(ctx, cfg)
		if err != nil {
			t.Fatalf("start etcd: %v", err)
		}
		return s
	}
	srv := start()
	defer func() { srv.Close() }()
	cli, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	c := watcher.New(cli, "/r/", watcher.JSON[val], testOptions(t))
	rec := &recorder{}
	c.AddHandler(rec.handle)
	stop := runUntil(t, c)
	defer stop()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w := newWriter(cli, "/r/")
	var all []change
	for round := range 2 {
		cs, err := w.write(ctx, 200)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		all = append(all, cs...)
		if round == 0 {
			// Restart at once: the watcher is typically still behind.
			// (Close waits about 7s for the open watch stream to end.)
			srv.Close()
			srv = start()
		}
	}
	caughtUp(t, cli, c)
	checkExactlyOnce(t, all, rec)
	checkEqualsEtcd(t, cli, "/r/", c.Snapshot())
	stop() // before the server: its Close waits for open watches
}

func TestCompactionRelistsAndDeliversTheDifference(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	put := func(k, v string) int64 {
		t.Helper()
		resp, err := cli.Put(ctx, "/c/"+k, mustJSON(v))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	del := func(k string) int64 {
		t.Helper()
		resp, err := cli.Delete(ctx, "/c/"+k)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	for i := range 30 {
		put(fmt.Sprintf("k%02d", i), "v0")
	}

	fw := newFaultWatcher(cli)
	c := watcher.New(faultClient{cli, fw}, "/c/", watcher.JSON[val], testOptions(t))
	type entry struct {
		v   val
		rev int64
	}
	var (
		mu    sync.Mutex
		view  = map[string]entry{} // what the handler built from events alone
		seen  = map[change]bool{}
		after []watcher.Event[val] // events after the hold
		held  atomic.Bool
		syncs []watcher.SyncInfo
	)
	c.AddHandler(func(ev watcher.Event[val]) {
		mu.Lock()
		defer mu.Unlock()
		ch := change{ev.Key, ev.Revision, ev.Type}
		if seen[ch] {
			t.Errorf("delivered twice: %+v", ch)
		}
		seen[ch] = true
		if ev.Type == watcher.Deleted {
			delete(view, ev.Key)
		} else {
			view[ev.Key] = entry{ev.Value, ev.Revision}
		}
		if held.Load() {
			after = append(after, ev)
		}
	})
	c.OnSync(func(info watcher.SyncInfo) {
		mu.Lock()
		defer mu.Unlock()
		syncs = append(syncs, info)
	})
	run(t, c)
	put("k00", "v1")
	caughtUp(t, cli, c)

	// Break the stream and keep the watcher from resuming.
	held.Store(true)
	fw.holdNew()
	fw.breakAll(closeStream)
	eventually(t, "watcher waiting to resume", func() bool { return fw.held.Load() == 1 })

	for i := range 5 {
		del(fmt.Sprintf("k%02d", i)) // deleted
	}
	var twiceRev int64
	for i := 5; i < 10; i++ {
		put(fmt.Sprintf("k%02d", i), "v1")
		twiceRev = put(fmt.Sprintf("k%02d", i), "v2") // modified twice: only the last is seen
	}
	del("k10")
	recreated := put("k10", "again") // deleted and created again
	for i := range 4 {
		put(fmt.Sprintf("n%02d", i), "new") // new keys
	}
	put("tmp", "x")
	rev := del("tmp") // born and gone while the watcher was away: never seen
	if _, err := cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		t.Fatalf("compact: %v", err)
	}
	fw.release()

	eventually(t, "relist", func() bool { return c.Relists() == 1 && c.Revision() >= rev })
	snap := c.Snapshot()
	checkEqualsEtcd(t, cli, "/c/", snap)
	if snap.Revision() != rev {
		t.Errorf("Revision() = %d after relist, want %d", snap.Revision(), rev)
	}
	if it, _ := snap.Item("/c/k10"); it.CreateRevision != recreated {
		t.Errorf("k10 CreateRevision = %d, want %d (recreated)", it.CreateRevision, recreated)
	}

	mu.Lock()
	defer mu.Unlock()
	want := map[string]entry{}
	for _, it := range snap.List() {
		want[it.Key] = entry{it.Value, it.ModRevision}
	}
	if !reflect.DeepEqual(view, want) {
		t.Errorf("handler view differs from etcd:\n got %v\nwant %v", view, want)
	}
	counts := map[watcher.EventType]int{}
	for _, ev := range after {
		counts[ev.Type]++
		if !ev.Synthetic {
			t.Errorf("event after compaction not synthetic: %+v", ev)
		}
		if ev.Key == "/c/k09" && (ev.Type != watcher.Modified || ev.Revision != twiceRev || ev.Value.V != "v2" || ev.Prev == nil || ev.Prev.V != "v0") {
			t.Errorf("k09 event = %+v, want one Modified v0 -> v2 at %d", ev, twiceRev)
		}
		if ev.Key == "/c/tmp" {
			t.Errorf("event for a key that never existed at a listed revision: %+v", ev)
		}
	}
	wantCounts := map[watcher.EventType]int{watcher.Deleted: 5, watcher.Modified: 6, watcher.Added: 4}
	if !reflect.DeepEqual(counts, wantCounts) {
		t.Errorf("events after compaction %v, want %v", counts, wantCounts)
	}
	if len(syncs) != 2 || syncs[1].Initial || syncs[1].Revision != rev ||
		syncs[1].Added != 4 || syncs[1].Modified != 6 || syncs[1].Deleted != 5 {
		t.Errorf("OnSync calls %+v, want an initial one then a relist at %d with 4/6/5", syncs, rev)
	}
}

func TestConcurrentWritersAndSnapshotReaders(t *testing.T) {
	cli := etcdtest.New(t)
	c := watcher.New(cli, "/w/", watcher.JSON[val], testOptions(t))
	rec := &recorder{}
	c.AddHandler(rec.handle)
	run(t, c)

	const writers, ops, keys = 8, 300, 40
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		changes []change
	)
	ctx := context.Background()
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range ops {
				key := fmt.Sprintf("/w/k%02d", rng.IntN(keys))
				var ch change
				if rng.IntN(4) == 0 {
					resp, err := cli.Delete(ctx, key)
					if err != nil {
						t.Error(err)
						return
					}
					if resp.Deleted == 0 {
						continue
					}
					ch = change{key, resp.Header.Revision, watcher.Deleted}
				} else {
					resp, err := cli.Put(ctx, key, mustJSON(fmt.Sprintf("%d-%d", w, i)), clientv3.WithPrevKV())
					if err != nil {
						t.Error(err)
						return
					}
					ch = change{key, resp.Header.Revision, watcher.Added}
					if resp.PrevKv != nil {
						ch.Type = watcher.Modified
					}
				}
				mu.Lock()
				changes = append(changes, ch)
				mu.Unlock()
			}
		})
	}

	type kept struct {
		snap *watcher.Snapshot[val]
		list []watcher.Item[val]
	}
	var (
		readers  sync.WaitGroup
		stop     = make(chan struct{})
		keptMu   sync.Mutex
		keptAll  []kept
		readsAll atomic.Int64
	)
	for range 4 {
		readers.Go(func() {
			var last int64
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				s := c.Snapshot()
				if s.Revision() < last {
					t.Errorf("snapshot revision went back: %d after %d", s.Revision(), last)
					return
				}
				last = s.Revision()
				list := s.List()
				if len(list) != s.Len() {
					t.Errorf("List has %d items, Len says %d", len(list), s.Len())
					return
				}
				for i, it := range list {
					if it.ModRevision <= 0 || it.ModRevision > s.Revision() {
						t.Errorf("item %s at revision %d in a snapshot at %d", it.Key, it.ModRevision, s.Revision())
						return
					}
					if i > 0 && list[i-1].Key >= it.Key {
						t.Errorf("List not sorted at %d", i)
						return
					}
					if v, ok := s.Get(it.Key); !ok || v != it.Value {
						t.Errorf("Get(%s) = %v, %v; List has %v", it.Key, v, ok, it.Value)
						return
					}
				}
				_, _ = c.Get("/w/k00")
				if n%20 == 0 && n < 4000 {
					keptMu.Lock()
					keptAll = append(keptAll, kept{s, list})
					keptMu.Unlock()
				}
				readsAll.Add(1)
				// Pace the readers so that, on two cores, the writers
				// and etcd get CPU too.
				time.Sleep(100 * time.Microsecond)
			}
		})
	}
	wg.Wait()
	caughtUp(t, cli, c)
	close(stop)
	readers.Wait()

	checkEqualsEtcd(t, cli, "/w/", c.Snapshot())
	checkExactlyOnce(t, changes, rec)
	// Snapshots kept while the cache moved on have not changed.
	for _, k := range keptAll {
		if !reflect.DeepEqual(k.snap.List(), k.list) {
			t.Fatalf("snapshot at revision %d changed after it was taken", k.snap.Revision())
		}
	}
	t.Logf("%d changes, %d snapshot reads, %d kept", len(changes), readsAll.Load(), len(keptAll))
}

func TestDecodeErrorsAreSkippedAndCounted(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	put := func(k, raw string) {
		t.Helper()
		if _, err := cli.Put(ctx, "/d/"+k, raw); err != nil {
			t.Fatal(err)
		}
	}
	put("a", "{broken")
	put("b", mustJSON("b"))
	c := watcher.New(cli, "/d/", watcher.JSON[val], testOptions(t))
	rec := &recorder{}
	c.AddHandler(rec.handle)
	run(t, c)

	type want struct {
		errors int64
		a      string // "" means absent
		last   string // type and value of the last event
	}
	check := func(step string, w want) {
		t.Helper()
		caughtUp(t, cli, c)
		if got := c.DecodeErrors(); got != w.errors {
			t.Errorf("%s: DecodeErrors() = %d, want %d", step, got, w.errors)
		}
		v, ok := c.Get("/d/a")
		if ok != (w.a != "") || v.V != w.a {
			t.Errorf("%s: Get(a) = %v, %v; want %q", step, v, ok, w.a)
		}
		evs := rec.events()
		last := evs[len(evs)-1]
		if got := fmt.Sprintf("%s %s %s", last.Type, last.Key, last.Value.V); got != w.last {
			t.Errorf("%s: last event %q, want %q", step, got, w.last)
		}
	}
	check("first list", want{errors: 1, a: "", last: "added /d/b b"})
	put("a", mustJSON("a1"))
	check("fixed", want{errors: 1, a: "a1", last: "added /d/a a1"})
	put("a", "nope")
	check("broken again", want{errors: 2, a: "", last: "deleted /d/a a1"})
	put("b", mustJSON("b2"))
	check("others still flow", want{errors: 2, a: "", last: "modified /d/b b2"})
	put("a", mustJSON("a3"))
	check("fixed again", want{errors: 2, a: "a3", last: "added /d/a a3"})
	checkEqualsEtcd(t, cli, "/d/", c.Snapshot())
}

func TestRunStopsCleanly(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	if _, err := cli.Get(ctx, "warm-up"); err != nil {
		t.Fatal(err)
	}
	baseline := runtime.NumGoroutine()

	c := watcher.New(cli, "/s/", watcher.JSON[val], testOptions(t))
	sub := c.Subscribe(4)
	rctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- c.Run(rctx) }()
	if err := c.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/s/a", mustJSON("a")); err != nil {
		t.Fatal(err)
	}
	if ev := <-sub; ev.Type != watcher.Added || ev.Key != "/s/a" || ev.Value.V != "a" || ev.Synthetic {
		t.Errorf("subscriber got %+v, want a live Added /s/a", ev)
	}
	if err := c.Run(rctx); !errors.Is(err, watcher.ErrStarted) {
		t.Errorf("second Run = %v, want ErrStarted", err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Errorf("AddHandler after Run did not panic")
			}
		}()
		c.AddHandler(func(watcher.Event[val]) {})
	}()

	cancel()
	if err := <-errc; err != nil {
		t.Errorf("Run = %v, want nil on cancel", err)
	}
	if _, ok := <-sub; ok {
		t.Errorf("subscriber channel open after Run returned")
	}
	if err := c.WaitSynced(ctx); err != nil {
		t.Errorf("WaitSynced after Run = %v, want nil (it did sync)", err)
	}
	eventually(t, "goroutines to settle", func() bool { return runtime.NumGoroutine() <= baseline })
}

// failingKV refuses every read, as an unreachable etcd would.
type failingKV struct {
	clientv3.KV
	gets atomic.Int64
}

func (f *failingKV) Get(context.Context, string, ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	f.gets.Add(1)
	return nil, errors.New("injected: etcd unreachable")
}

// TestWaitSyncedFailsWhenRunStopsFirst: a cache whose Run ended before its
// first list fails WaitSynced with ErrStopped, and says which end of its
// context stopped it, so that a reader of a cache run by another component
// can tell a shutdown from a failure.
func TestWaitSyncedFailsWhenRunStopsFirst(t *testing.T) {
	for _, tc := range []struct {
		name  string
		end   func(context.Context) (context.Context, func())
		cause error
	}{
		{"cancelled", func(ctx context.Context) (context.Context, func()) {
			ctx, cancel := context.WithCancel(ctx)
			return ctx, cancel
		}, context.Canceled},
		{"deadline", func(ctx context.Context) (context.Context, func()) {
			// The deadline passes while the list keeps failing.
			ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			t.Cleanup(cancel)
			return ctx, func() {}
		}, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kv := &failingKV{}
			c := watcher.New(struct {
				clientv3.KV
				clientv3.Watcher
			}{kv, nil}, "/f/", watcher.JSON[val], testOptions(t))
			ctx, end := tc.end(context.Background())
			errc := make(chan error, 1)
			go func() { errc <- c.Run(ctx) }()
			eventually(t, "list retries", func() bool { return kv.gets.Load() >= 3 })
			end()
			if err := <-errc; err != nil {
				t.Errorf("Run = %v", err)
			}
			err := c.WaitSynced(context.Background())
			if !errors.Is(err, watcher.ErrStopped) || !errors.Is(err, tc.cause) {
				t.Errorf("WaitSynced = %v, want ErrStopped and %v", err, tc.cause)
			}
		})
	}
}

// TestMissedChangeRelists: the cache checks every put against the version
// it holds, so a change the stream lost (a put, or a delete and the create
// after it) makes it list again, and the OnSync hooks tell consumers with
// derived state. The same writes with nothing lost relist nothing.
func TestMissedChangeRelists(t *testing.T) {
	for _, tc := range []struct {
		name string
		lose bool
		// write changes /m/k1 with put and del; loseNext makes the stream
		// lose the next change.
		write func(put func(v string), del func(), loseNext func())
	}{
		{"nothing lost", false, func(put func(string), del func(), _ func()) {
			put("v1")
			put("v2")
			del()
			put("v3")
		}},
		{"a put lost", true, func(put func(string), del func(), loseNext func()) {
			loseNext()
			put("v1")
			put("v2")
		}},
		{"a delete lost, then the key created again", true, func(put func(string), del func(), loseNext func()) {
			loseNext()
			del()
			put("v3")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli := etcdtest.New(t)
			ctx := context.Background()
			const key = "/m/k1"
			var last atomic.Int64 // the revision of the test's newest write: it is etcd's only writer
			put := func(v string) {
				t.Helper()
				resp, err := cli.Put(ctx, key, mustJSON(v))
				if err != nil {
					t.Fatal(err)
				}
				last.Store(resp.Header.Revision)
			}
			del := func() {
				t.Helper()
				resp, err := cli.Delete(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				last.Store(resp.Header.Revision)
			}
			put("v0")
			resp, err := cli.Put(ctx, "/m/k2", mustJSON("other"))
			if err != nil {
				t.Fatal(err)
			}
			last.Store(resp.Header.Revision)
			fw := newFaultWatcher(cli)
			c := watcher.New(faultClient{cli, fw}, "/m/", watcher.JSON[val], testOptions(t))
			var relists atomic.Int64
			c.OnSync(func(si watcher.SyncInfo) {
				if !si.Initial {
					relists.Add(1)
				}
			})
			run(t, c)
			var lost atomic.Int64 // the revision of the change to lose
			lose := func(ev *clientv3.Event) bool { return ev.Kv.ModRevision == lost.Load() }
			fw.lose.Store(&lose)
			tc.write(put, del, func() { lost.Store(last.Load() + 1) })
			// A marker written last: once the cache shows it, it has
			// applied (or relisted past) every change before it.
			resp, err = cli.Put(ctx, "/m/marker", mustJSON("end"))
			if err != nil {
				t.Fatal(err)
			}
			eventually(t, "the cache to reach the marker", func() bool { return c.Snapshot().Revision() >= resp.Header.Revision })
			if tc.lose {
				eventually(t, "a relist after the lost change", func() bool { return relists.Load() > 0 })
			} else if n := relists.Load(); n != 0 {
				t.Fatalf("nothing was lost, yet the cache listed again %d times: its version check refuses changes that follow", n)
			}
			got, ok := c.Snapshot().Item(key)
			want, err := cli.Get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if !ok || len(want.Kvs) != 1 {
				t.Fatalf("cache has %s: %v, etcd has %d values", key, ok, len(want.Kvs))
			}
			kv := want.Kvs[0]
			if got.ModRevision != kv.ModRevision || got.CreateRevision != kv.CreateRevision || got.Version != kv.Version {
				t.Fatalf("cache holds %s at mod %d, create %d, version %d; etcd at %d, %d, %d",
					key, got.ModRevision, got.CreateRevision, got.Version, kv.ModRevision, kv.CreateRevision, kv.Version)
			}
		})
	}
}
