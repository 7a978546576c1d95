package state

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
)

// fillRandom sets every exported field reachable from v to a random value.
func fillRandom(rng *rand.Rand, v reflect.Value) {
	switch v.Kind() {
	case reflect.String:
		v.SetString(randomString(rng))
	case reflect.Int, reflect.Int64, reflect.Int32:
		v.SetInt([]int64{0, 0, 1, -1, rng.Int64N(100), rng.Int64(), -rng.Int64(), math.MaxInt64, math.MinInt64}[rng.IntN(9)])
	case reflect.Uint32, reflect.Uint64, reflect.Uint:
		v.SetUint([]uint64{0, 1, rng.Uint64N(1 << 16), math.MaxUint32}[rng.IntN(4)] & (1<<(8*v.Type().Size()) - 1))
	case reflect.Bool:
		v.SetBool(rng.IntN(2) == 0)
	case reflect.Float64:
		v.SetFloat(randomFloat(rng))
	case reflect.Pointer:
		if rng.IntN(3) == 0 {
			v.SetZero()
			return
		}
		v.Set(reflect.New(v.Type().Elem()))
		fillRandom(rng, v.Elem())
	case reflect.Slice:
		switch rng.IntN(4) {
		case 0:
			v.SetZero()
		case 1:
			v.Set(reflect.MakeSlice(v.Type(), 0, 0))
		default:
			n := 1 + rng.IntN(4)
			v.Set(reflect.MakeSlice(v.Type(), n, n))
			for i := range n {
				fillRandom(rng, v.Index(i))
			}
		}
	case reflect.Map:
		switch rng.IntN(4) {
		case 0:
			v.SetZero()
		case 1:
			v.Set(reflect.MakeMap(v.Type()))
		default:
			v.Set(reflect.MakeMap(v.Type()))
			for range 1 + rng.IntN([]int{5, 5, 5, 24}[rng.IntN(4)]) { // some past the encoders' key buffers
				k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
				fillRandom(rng, k)
				fillRandom(rng, e)
				if collides(v, k) {
					continue
				}
				v.SetMapIndex(k, e)
			}
		}
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(randomTime(rng)))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fillRandom(rng, v.Field(i))
			}
		}
	default:
		panic("fillRandom: no generator for " + v.Type().String())
	}
}

// collides reports whether map m has a key other than k that encodes to
// the same JSON string ("\xff" and "\ufffd" both become "\ufffd"): their
// order in an encoding is not defined, so a map holding both cannot be
// compared byte for byte.
func collides(m, k reflect.Value) bool {
	if k.Kind() != reflect.String {
		return false
	}
	enc := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	want := enc(k.String())
	for _, o := range m.MapKeys() {
		if o.String() != k.String() && enc(o.String()) == want {
			return true
		}
	}
	return false
}

func randomString(rng *rand.Rand) string {
	pieces := []string{"", "a", "sim0042", "GPU-sim0042-3", "ada", "Bound", "bound to sim0042 with 8 GPUs",
		`"`, `\`, "<", ">", "&", "\n", "\r", "\t", "\b", "\f", "\x00", "\x1f", "\x7f", " ", "é", "日本",
		"\u2028", "\u2029", "\xff", "\xe2\x80", "🚀", "\ufffd"}
	var sb strings.Builder
	for range rng.IntN(6) {
		sb.WriteString(pieces[rng.IntN(len(pieces))])
	}
	return sb.String()
}

func randomFloat(rng *rand.Rand) float64 {
	switch rng.IntN(8) {
	case 0:
		return 0
	case 1:
		return math.Copysign(0, -1)
	case 2:
		return rng.Float64()
	case 3:
		return -rng.Float64() * 1e3
	case 4: // about the 1e-6 cutoff
		return math.Nextafter(1e-6, []float64{0, 1}[rng.IntN(2)]) * []float64{1, -1}[rng.IntN(2)]
	case 5: // about the 1e21 cutoff
		return math.Nextafter(1e21, []float64{0, math.Inf(1)}[rng.IntN(2)])
	case 6:
		return math.Ldexp(rng.Float64(), rng.IntN(2000)-1000)
	default:
		return float64(rng.IntN(1000)) / 8
	}
}

func randomTime(rng *rand.Rand) time.Time {
	if rng.IntN(6) == 0 {
		return time.Time{}
	}
	if rng.IntN(6) == 0 {
		return time.Now() // with a monotonic reading
	}
	sec := rng.Int64N(253402300799) - 62135596800 // years 1 to 9999
	ns := []int64{0, rng.Int64N(1e9), 5e8, 1e3}[rng.IntN(4)]
	zones := []*time.Location{time.UTC, time.Local, time.FixedZone("", 0),
		time.FixedZone("E", 5*3600+30*60), time.FixedZone("W", -(9*3600 + 45*60 + 12)), time.FixedZone("M", 23*3600+59*60)}
	return time.Unix(sec, ns).In(zones[rng.IntN(len(zones))])
}

// BindOps writes, key by key and in the same order, what Encode writes for
// each ledger, status and binding of a batch of random placements.
func TestBindOpsWritesWhatEncodeWrites(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	k := MustKeys(DefaultPrefix)
	for range 200 {
		var lws []LedgerWrite
		var ps []Placement
		for range rng.IntN(6) {
			var lw LedgerWrite
			fillRandom(rng, reflect.ValueOf(&lw).Elem())
			lws = append(lws, lw)
		}
		for range rng.IntN(12) {
			var p Placement
			fillRandom(rng, reflect.ValueOf(&p).Elem())
			p.Quotas = nil
			ps = append(ps, p)
		}
		type kv struct{ key, value string }
		var want []kv
		var wantCmps []clientv3.Cmp
		eq := func(key string, rev int64) {
			wantCmps = append(wantCmps, clientv3.Compare(clientv3.ModRevision(key), "=", rev))
		}
		for _, lw := range lws {
			eq(k.Ledger(lw.Node), lw.ReadRevision)
			eq(k.Node(lw.Node), lw.NodeRevision)
			eq(k.Cordon(lw.Node), lw.CordonRevision)
		}
		for _, p := range ps {
			eq(k.Pending(p.Session), p.PendingRevision)
		}
		for _, lw := range lws {
			v, err := Encode(lw.Ledger)
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, kv{k.Ledger(lw.Node), v})
		}
		for _, p := range ps {
			want = append(want, kv{k.Pending(p.Session), ""})
			st := p.Status
			st.Phase, st.QueueRevision = PhaseBound, p.PendingRevision
			v, err := Encode(st)
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, kv{k.Status(p.Session), v})
			for _, b := range p.Bindings {
				v, err := Encode(b)
				if err != nil {
					t.Fatal(err)
				}
				want = append(want, kv{k.Binding(b.Node, b.Session), v})
			}
		}
		// Then each placement's secrets, to each of its bindings' nodes.
		for _, p := range ps {
			if p.Secrets == nil {
				continue
			}
			v, err := Encode(p.Secrets)
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range p.Bindings {
				want = append(want, kv{k.BoundSecrets(b.Node, p.Session), v})
			}
		}
		cmps, ops, err := BindOps(k, lws, ps)
		if err != nil {
			t.Fatal(err)
		}
		if len(cmps) != len(wantCmps) {
			t.Fatalf("%d compares, want %d", len(cmps), len(wantCmps))
		}
		for i := range cmps {
			if !proto.Equal(cmps[i].GetCompare(), wantCmps[i].GetCompare()) {
				t.Fatalf("compare %d: %v, want %v", i, cmps[i].GetCompare(), wantCmps[i].GetCompare())
			}
		}
		if len(ops) != len(want) {
			t.Fatalf("%d operations, want %d", len(ops), len(want))
		}
		for i, op := range ops {
			if string(op.KeyBytes()) != want[i].key || string(op.ValueBytes()) != want[i].value || op.IsDelete() != (want[i].value == "") || op.RangeBytes() != nil {
				t.Fatalf("operation %d: %s %q = %s, want %q = %s", i, map[bool]string{true: "delete", false: "put"}[op.IsDelete()],
					op.KeyBytes(), op.ValueBytes(), want[i].key, want[i].value)
			}
		}
	}
}
