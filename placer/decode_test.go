package placer

import (
	"reflect"
	"testing"
	"unsafe"

	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// The shared caches' decoders give exactly what plain JSON gives, with
// repeated strings stored once.
func TestSharedDecodersMatchJSON(t *testing.T) {
	k := state.MustKeys(state.DefaultPrefix)
	enc := func(v any) []byte {
		t.Helper()
		b, err := state.Encode(v)
		if err != nil {
			t.Fatal(err)
		}
		return []byte(b)
	}
	same := func(a, b string) bool {
		return unsafe.StringData(a) == unsafe.StringData(b)
	}

	t.Run("queue entry", func(t *testing.T) {
		wr := state.Resources{GPUs: 2, GPUModel: "*A100*", MIGProfile: "1g.10gb", CPUMilli: 1000, MemoryMiB: 1024}
		e := state.QueueEntry{Session: "s-1", Kind: state.KindBatch, Owner: "ada", Groups: []string{"ml", "vision"}, Priority: 3,
			Created: t0, Enqueued: t0, Request: state.Resources{GPUs: 1, GPUModel: "*H100*", CPUMilli: 500, MemoryMiB: 512,
				NodeSelector: map[string]string{"zone": "a"}}, Workers: 2, WorkerRequest: &wr}
		key := k.Pending("s-1")
		want, err := watcher.JSON[state.QueueEntry](key, enc(e))
		if err != nil {
			t.Fatal(err)
		}
		dec := decodeQueueEntry(k)
		got, err := dec(key, enc(e))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decoded %+v, want %+v", got, want)
		}
		if !same(got.Session, key[len(key)-len("s-1"):]) {
			t.Error("the session id does not share the key's memory")
		}
		again, _ := dec(k.Pending("s-1"), enc(e))
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
		want, err := watcher.JSON[state.Node](k.Node("n1"), enc(n))
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeNode(k.Node("n1"), enc(n))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decoded %+v, want %+v", got, want)
		}
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
		want, err := watcher.JSON[state.Ledger](k.Ledger("n1"), enc(l))
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeLedger(k.Ledger("n1"), enc(l))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decoded %+v, want %+v", got, want)
		}
		if !same(got.Allocations["a"].Owner, got.Allocations["b"].Owner) {
			t.Error("the owner is stored per allocation")
		}
	})
}
