package state

import (
	stdjson "encoding/json"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
)

// storedTypes are the values Voyager stores in etcd (docs/state.md).
var storedTypes = []any{
	Session{}, Eviction{}, Warning{}, Secrets{}, QueueEntry{}, Status{}, Activity{},
	Node{}, Ledger{}, Binding{}, Cordon{}, Quota{}, Profile{}, RayToken{}, Placer{},
}

// fill sets every field of v, recursively, to a value that is not the
// zero one: strings with characters JSON escapes (quotes, HTML, U+2028),
// maps with several keys (their order must come out sorted), negative
// numbers, a time with nanoseconds and a zone.
func fill(t *testing.T, v reflect.Value, depth int) {
	if depth > 6 {
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf(`a"<b>&c\%d`+"\u2028é", depth))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(-int64(3 + depth))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(7 + depth))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(0.125 + float64(depth))
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fill(t, p.Elem(), depth+1)
		v.Set(p)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fill(t, s.Index(i), depth+1)
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for i := range 3 {
			k := reflect.New(v.Type().Key()).Elem()
			if k.Kind() == reflect.String {
				k.SetString(fmt.Sprintf("k%d-%d", 3-i, depth))
			} else {
				fill(t, k, depth+1)
			}
			e := reflect.New(v.Type().Elem()).Elem()
			fill(t, e, depth+1)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Date(2026, 11, 26, 22, 40, 1, 123456789, time.FixedZone("x", 3600))))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(t, v.Field(i), depth+1)
			}
		}
	case reflect.Interface:
		v.Set(reflect.ValueOf("any"))
	default:
		t.Fatalf("fill: no value for a %s", v.Type())
	}
}

// TestCodecIsEncodingJSON: Encode uses a faster encoder than encoding/json
// (issue 16), but what is stored must stay what encoding/json writes and
// reads (operators' etcdctl, older readers, docs/state.md): every stored
// type, every field set, encodes to the same bytes, and decodes to the
// same value, as with encoding/json.
func TestCodecIsEncodingJSON(t *testing.T) {
	for _, typ := range storedTypes {
		rt := reflect.TypeOf(typ)
		t.Run(rt.Name(), func(t *testing.T) {
			v := reflect.New(rt)
			fill(t, v.Elem(), 0)
			want, err := stdjson.Marshal(v.Interface())
			if err != nil {
				t.Fatalf("encoding/json: %v", err)
			}
			got, err := Encode(v.Interface())
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			if got != string(want) {
				t.Fatalf("Encode wrote\n%s\nencoding/json writes\n%s", got, want)
			}
			appended, err := appendJSON([]byte("x"), v.Interface())
			if err != nil || string(appended) != "x"+string(want) {
				t.Fatalf("appendJSON wrote %q (%v), want x then encoding/json's bytes", appended, err)
			}
			std := reflect.New(rt)
			if err := stdjson.Unmarshal(want, std.Interface()); err != nil {
				t.Fatalf("encoding/json decode: %v", err)
			}
			ours := reflect.New(rt)
			if err := decodeInto(want, ours.Interface()); err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(std.Interface(), ours.Interface()) {
				t.Fatalf("Decode read\n%#v\nencoding/json reads\n%#v", ours.Elem().Interface(), std.Elem().Interface())
			}
		})
	}
}

// TestDecodeRefusesWhatEncodingJSONRefuses: a stored value that is not
// JSON, or not of the type read, is an error, as with encoding/json;
// fields a newer writer added are ignored.
func TestDecodeRefusesWhatEncodingJSONRefuses(t *testing.T) {
	for _, bad := range []string{``, `{`, `{"node": 5}`, `[]`, `{"allocations": {"s1": 3}}`} {
		if _, err := Decode[Ledger]([]byte(bad)); err == nil {
			t.Errorf("Decode[Ledger](%q) = nil error, want one", bad)
		}
		var l Ledger
		if stdjson.Unmarshal([]byte(bad), &l) == nil {
			t.Errorf("encoding/json accepts %q: the case does not test a refusal", bad)
		}
	}
	l, err := Decode[Ledger]([]byte(`{"node":"n1","from_a_newer_writer":{"x":[1,2]}}`))
	if err != nil || l.Node != "n1" {
		t.Fatalf("Decode with an unknown field = %+v, %v; want node n1 and no error", l, err)
	}
}

// TestDecodeKeepsNotItsInput: caches hold what Decode returns for as long
// as the key lives (100,000 queue entries at a large site), so a decoded
// value must not keep its input alive: an entry stored with 64 KiB of a
// field this reader does not know keeps a few hundred bytes, not the 64
// KiB (goccy/go-json's strings point into its copy of the input).
func TestDecodeKeepsNotItsInput(t *testing.T) {
	pad := strings.Repeat("x", 64<<10)
	b := []byte(`{"session":"s1","owner":"ada","kind":"batch","from_a_newer_writer":"` + pad + `"}`)
	const n = 200
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	kept := make([]QueueEntry, n)
	for i := range kept {
		var err error
		if kept[i], err = Decode[QueueEntry](b); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / n
	if per > 8<<10 {
		t.Errorf("each decoded entry keeps %d bytes alive, want well under its 64 KiB input", per)
	}
	if kept[n-1].Owner != "ada" {
		t.Fatalf("decoded %+v", kept[n-1])
	}
	runtime.KeepAlive(kept)
}
