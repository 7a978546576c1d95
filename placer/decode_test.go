package placer

import (
	"reflect"
	"testing"
	"unsafe"

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
