package placer

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// decodeAsJSON decodes v's JSON with dec and fails t unless that gives
// what plain JSON decoding gives.
func decodeAsJSON[T any](t *testing.T, dec watcher.DecodeFunc[T], key string, v T) T {
	t.Helper()
	b, err := state.Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	want, err := watcher.JSON[T](key, []byte(b))
	if err != nil {
		t.Fatal(err)
	}
	got, err := dec(key, []byte(b))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded %+v, want %+v", got, want)
	}
	return got
}

// The shared caches' decoders give exactly what plain JSON gives, with
// repeated strings stored once.
func TestSharedDecodersMatchJSON(t *testing.T) {
	k := state.MustKeys(state.DefaultPrefix)
	same := func(a, b string) bool {
		return unsafe.StringData(a) == unsafe.StringData(b)
	}

	t.Run("queue entry", func(t *testing.T) {
		wr := state.Resources{GPUs: 2, GPUModel: "*A100*", MIGProfile: "1g.10gb", CPUMilli: 1000, MemoryMiB: 1024}
		e := state.QueueEntry{Session: "s-1", Kind: state.KindBatch, Owner: "ada", Groups: []string{"ml", "vision"}, Priority: 3,
			Created: t0, Enqueued: t0, Request: state.Resources{GPUs: 1, GPUModel: "*H100*", CPUMilli: 500, MemoryMiB: 512,
				NodeSelector: map[string]string{"zone": "a"}}, Workers: 2, WorkerRequest: &wr}
		key := k.Pending("s-1")
		dec := decodeQueueEntry(k)
		got := decodeAsJSON(t, dec, key, e)
		if !same(got.Session, key[len(key)-len("s-1"):]) {
			t.Error("the session id does not share the key's memory")
		}
		again := decodeAsJSON(t, dec, k.Pending("s-1"), e)
		if !same(got.Owner, again.Owner) || !same(got.Groups[1], again.Groups[1]) ||
			!same(got.WorkerRequest.MIGProfile, again.WorkerRequest.MIGProfile) || !same(string(got.Kind), string(again.Kind)) {
			t.Error("owner, group, profile or kind stored twice")
		}
		if _, err := dec(key, []byte("{")); err == nil {
			t.Error("a broken value decoded")
		}
	})

	t.Run("node", func(t *testing.T) {
		n := gpuNode("n1", 8, "NVIDIA A100-SXM4-80GB")
		n.GPUs[7].MIGEnabled = true
		n.GPUs[7].MIGDevices = []state.MIGDevice{{UUID: "MIG-1", Profile: "1g.10gb", MemoryMiB: 9856}}
		n.GPUs[6].NVLinkPeers = append(n.GPUs[6].NVLinkPeers, "GPU-elsewhere")
		got := decodeAsJSON(t, decodeNode, k.Node("n1"), n)
		peer := got.GPUs[0].NVLinkPeers[0]
		if peer != got.GPUs[1].UUID || !same(peer, got.GPUs[1].UUID) {
			t.Errorf("peer %q does not share GPU 1's UUID string", peer)
		}
		if !same(got.GPUs[0].Model, got.GPUs[5].Model) {
			t.Error("the model is stored per GPU")
		}
	})

	t.Run("ledger", func(t *testing.T) {
		l := state.Ledger{Node: "n1", Allocations: map[string]state.Allocation{
			"a": {Kind: state.KindNotebook, Owner: "ada", Groups: []string{"ml"}, Role: state.RoleSingle, GPUs: []string{"GPU-n1-0"}, CPUMilli: 1, MemoryMiB: 1, Ports: []int{40000}},
			"b": {Kind: state.KindNotebook, Owner: "ada", Role: state.RoleHead, CPUMilli: 2, MemoryMiB: 2},
		}}
		got := decodeAsJSON(t, decodeLedger, k.Ledger("n1"), l)
		if !same(got.Allocations["a"].Owner, got.Allocations["b"].Owner) {
			t.Error("the owner is stored per allocation")
		}
	})
}

// fullLedger is a ledger with every field of every allocation set,
// strings with characters JSON escapes.
func fullLedger(node string, allocs int) state.Ledger {
	l := state.Ledger{Node: node, Allocations: map[string]state.Allocation{}}
	for i := range allocs {
		id := fmt.Sprintf("s%02d-\"<x>&\u2028é", i)
		l.Allocations[id] = state.Allocation{Kind: state.KindNotebook, Owner: "ada\"<&>", Groups: []string{"ml", "vision"},
			Priority: -2, Preemptible: true, Role: state.RoleHead, GPUs: []string{fmt.Sprintf("GPU-%s-%d", node, i), "MIG-é"},
			Parents:  map[string]string{"MIG-é": fmt.Sprintf("GPU-%s-9é", node)},
			CPUMilli: 1500, MemoryMiB: 2048, Ports: []int{40000 + i, 40100 + i}, Plan: 77, Queued: t0.Add(time.Duration(i) * time.Nanosecond)}
	}
	return l
}

// TestDecodeLedgerIsEncodingJSON: decodeLedger reads with another decoder
// than encoding/json; it reads every field the same, ignores fields a
// newer writer added, and refuses what encoding/json refuses.
func TestDecodeLedgerIsEncodingJSON(t *testing.T) {
	k := state.MustKeys(state.DefaultPrefix)
	decodeAsJSON(t, decodeLedger, k.Ledger("n1"), fullLedger("n1", 3))
	decodeAsJSON(t, decodeLedger, k.Ledger("n1"), state.Ledger{Node: "n1"})
	l, err := decodeLedger(k.Ledger("n1"), []byte(`{"node":"n1","from_a_newer_writer":{"x":[1,2]},"allocations":{}}`))
	if err != nil || l.Node != "n1" || l.Allocations == nil {
		t.Fatalf("decoded %+v, %v; want node n1, no allocations and no error", l, err)
	}
	for _, bad := range []string{``, `{`, `{"node": 5}`, `[]`, `{"allocations": {"s1": 3}}`, `{"node":"n1"} x`} {
		var std state.Ledger
		if json.Unmarshal([]byte(bad), &std) == nil {
			t.Fatalf("encoding/json accepts %q: the case does not test a refusal", bad)
		}
		if _, err := decodeLedger(k.Ledger("n1"), []byte(bad)); err == nil {
			t.Errorf("decodeLedger(%q) = nil error, want one", bad)
		}
	}
}

// TestDecodeLedgerKeepsNotItsInput: a ledger cache keeps what decodeLedger
// returns for as long as the node lives, so that must not keep its input
// alive: a ledger stored with 64 KiB of a field this reader does not know
// keeps its allocations, not the 64 KiB.
func TestDecodeLedgerKeepsNotItsInput(t *testing.T) {
	k := state.MustKeys(state.DefaultPrefix)
	v, err := state.Encode(fullLedger("n1", 4))
	if err != nil {
		t.Fatal(err)
	}
	b := []byte(v[:len(v)-1] + `,"from_a_newer_writer":"` + strings.Repeat("x", 64<<10) + `"}`)
	const n = 200
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	kept := make([]state.Ledger, n)
	for i := range kept {
		if kept[i], err = decodeLedger(k.Ledger("n1"), b); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / n; per > 16<<10 {
		t.Errorf("each decoded ledger keeps %d bytes alive, want well under its 64 KiB input", per)
	}
	if len(kept[n-1].Allocations) != 4 {
		t.Fatalf("decoded %+v", kept[n-1])
	}
	runtime.KeepAlive(kept)
}

// TestInternKeepsOneCopyAcrossCollections: a value interned before a
// collection and the same value decoded after it share one copy, and
// neither is the memory it was read from. (unique.Make, which intern
// used before, stored a new copy after each collection: its table holds a
// value only while a handle to it lives.)
func TestInternKeepsOneCopyAcrossCollections(t *testing.T) {
	read := func() string { return string([]byte("owner-" + t.Name())) } // a fresh copy each time
	in := read()
	first := intern(in)
	if unsafe.StringData(first) == unsafe.StringData(in) {
		t.Fatalf("intern returned its input, which may point into a decoder's buffer")
	}
	runtime.GC()
	runtime.GC()
	second := intern(read())
	if unsafe.StringData(first) != unsafe.StringData(second) {
		t.Errorf("the same value interned before and after a collection: two copies, want one")
	}
	if first != "owner-"+t.Name() || second != first {
		t.Errorf("interned %q and %q, want %q", first, second, "owner-"+t.Name())
	}
}

// isKeyTail tells an id that the queue decoder took from its key apart from
// an equal id held anywhere else, by the strings' memory alone.
func TestIsKeyTail(t *testing.T) {
	key := "/voyager/pending/s-1"
	tail := key[len(key)-len("s-1"):]
	for _, c := range []struct {
		name, key, id string
		want          bool
	}{
		{"the key's own tail", key, tail, true},
		{"an equal copy", key, strings.Clone(tail), false},
		{"the key's middle", key, key[1:4], false},
		{"the whole key", key, key, false},
		{"empty", key, key[len(key):], false},
	} {
		if got := isKeyTail(c.key, c.id); got != c.want {
			t.Errorf("%s: isKeyTail = %v, want %v", c.name, got, c.want)
		}
	}
}

// A snapshot names each queued session by its key, whichever decoder its
// cache used: the shared caches' (which puts the key's id in the entry) or
// plain JSON's (the API's), for entries written with their id, without one,
// or with another's.
func TestSnapshotNamesEachEntryByItsKey(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx := context.Background()
	k := state.MustKeys(state.DefaultPrefix)
	written := map[string]string{"own": "own", "none": "", "other": "someone-else"} // key's id → the entry's
	for id, inEntry := range written {
		v, err := state.Encode(state.QueueEntry{Session: inEntry, Owner: "ada", Created: t0, Request: state.Resources{GPUs: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, k.Pending(id), v); err != nil {
			t.Fatal(err)
		}
	}
	for name, dec := range map[string]watcher.DecodeFunc[state.QueueEntry]{"shared": decodeQueueEntry(k), "json": watcher.JSON[state.QueueEntry]} {
		t.Run(name, func(t *testing.T) {
			pending := watcher.New(cli, k.PendingDir(), dec, watcher.Options{Name: "pending", Logger: quietLogger()})
			others := func(prefix string) watcher.Options { return watcher.Options{Name: prefix, Logger: quietLogger()} }
			nodes := watcher.New(cli, k.Nodes(), watcher.JSON[state.Node], others("nodes"))
			ledgers := watcher.New(cli, k.Ledgers(), watcher.JSON[state.Ledger], others("ledgers"))
			cordons := watcher.New(cli, k.Cordons(), watcher.JSON[state.Cordon], others("cordons"))
			quotas := watcher.New(cli, k.Quotas(), watcher.JSON[state.Quota], others("quotas"))
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			for _, run := range []func(context.Context) error{pending.Run, nodes.Run, ledgers.Run, cordons.Run, quotas.Run} {
				go func() { _ = run(cctx) }()
			}
			for _, w := range []interface{ WaitSynced(context.Context) error }{pending, nodes, ledgers, cordons, quotas} {
				if err := w.WaitSynced(ctx); err != nil {
					t.Fatal(err)
				}
			}
			s := SnapshotOf(k, Caches{Nodes: nodes.Snapshot(), Ledgers: ledgers.Snapshot(), Cordons: cordons.Snapshot(),
				Quotas: quotas.Snapshot(), Pending: pending.Snapshot()}, t0)
			got := map[string]bool{}
			for _, it := range s.Pending {
				got[it.Entry.Session] = true
			}
			if len(got) != len(written) || !got["own"] || !got["none"] || !got["other"] {
				t.Errorf("the snapshot's queue names %v, want own, none and other", slices.Sorted(maps.Keys(got)))
			}
		})
	}
}
