package state_test

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

func TestParseIndexSet(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []int
		wantErr string
	}{
		{"0-4", []int{0, 1, 2, 3, 4}, ""},
		{"7", []int{7}, ""},
		{"0-20:10", []int{0, 10, 20}, ""},
		{"1,5,7-9", []int{1, 5, 7, 8, 9}, ""},
		{"", nil, "empty"},
		{"5-3", nil, "runs backwards"},
		{"1,1", nil, "index 1 appears twice"},
		{"0-3,2", nil, "index 2 appears twice"},
		{"a-3", nil, `"a" is no index`},
		{"-1", nil, `"" is no index`},
		{"3:2", nil, "a step needs a range"},
		{"0-9:0", nil, "want a whole number of at least 1"},
		{"0-1000000", nil, `"1000000" is no index`},
		{"0-1000", nil, "more than 1000 elements"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := state.ParseIndexSet(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseIndexSet(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseIndexSet(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestArrayElement(t *testing.T) {
	now := time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)
	a := state.Array{ID: "s01", Owner: "ada", Groups: []string{"vision"}, Indices: "0-1", Params: []string{"lr=0.1", "lr=0.01"},
		Template: state.Session{Kind: state.KindBatch, Command: []string{"train", "--seed", "{index}", "--{param}"}, Env: map[string]string{"RUN": "r{index}"}}}
	ix, err := state.ParseIndexSet(a.Indices)
	if err != nil {
		t.Fatal(err)
	}
	s := a.Element(ix, 1, now)
	if s.ID != "s01-1" || s.Owner != "ada" || s.Array == nil || *s.Array != (state.ArrayMember{ID: "s01", Index: 1}) || s.Desired != state.DesiredRunning || !s.Created.Equal(now) {
		t.Errorf("element: %+v", s)
	}
	if want := []string{"train", "--seed", "1", "--lr=0.01"}; !reflect.DeepEqual(s.Command, want) {
		t.Errorf("command %q, want %q", s.Command, want)
	}
	want := map[string]string{"RUN": "r1", state.EnvArrayID: "s01", state.EnvArrayIndex: "1", state.EnvArraySize: "2", state.EnvArrayParam: "lr=0.01"}
	if !reflect.DeepEqual(s.Env, want) {
		t.Errorf("env %v, want %v", s.Env, want)
	}
	if a.Template.Command[2] != "{index}" || a.Template.Env["RUN"] != "r{index}" {
		t.Errorf("the template changed: %+v", a.Template)
	}
	for _, tc := range []struct {
		id    string
		index int
		ok    bool
	}{{"s01-7", 7, true}, {"s01-0", 0, true}, {"s01-07", 0, false}, {"s01-", 0, false}, {"s01x-7", 0, false}, {"s02-7", 0, false}, {"s01-7-1", 0, false}} {
		if n, ok := state.ElementIndex("s01", tc.id); n != tc.index || ok != tc.ok {
			t.Errorf("ElementIndex(s01, %q) = %d, %v; want %d, %v", tc.id, n, ok, tc.index, tc.ok)
		}
	}
}

// TestCreateArrayGuards: an array whose template was resolved from a
// volume definition is written only while that definition is unchanged
// (ErrConflict, nothing written, after a redefinition); a taken id is
// ErrExists.
func TestCreateArrayGuards(t *testing.T) {
	cli := etcdtest.New(t)
	k := state.MustKeys(state.DefaultPrefix)
	ctx := context.Background()
	rev, err := state.Put(ctx, cli, k.Volume("data"), state.Volume{Name: "data", HostPath: "/srv/data"})
	if err != nil {
		t.Fatal(err)
	}
	guard := clientv3.Compare(clientv3.ModRevision(k.Volume("data")), "=", rev)
	if _, err := state.Put(ctx, cli, k.Volume("data"), state.Volume{Name: "data", HostPath: "/srv/other"}); err != nil {
		t.Fatal(err)
	}
	a := state.Array{ID: "sw-guard", Owner: "ada", Indices: "0-3", MaxRunning: 1, Created: time.Now().UTC(),
		Template: state.Session{Kind: state.KindBatch, Command: []string{"true"}}}
	if err := state.CreateArray(ctx, cli, k, a, guard); !errors.Is(err, state.ErrConflict) {
		t.Fatalf("create with a redefined volume: %v, want ErrConflict", err)
	}
	if r, _ := cli.Get(ctx, k.Array(a.ID), clientv3.WithCountOnly()); r.Count != 0 {
		t.Fatal("a refused create wrote the array")
	}
	if err := state.CreateArray(ctx, cli, k, a); err != nil {
		t.Fatal(err)
	}
	if err := state.CreateArray(ctx, cli, k, a); !errors.Is(err, state.ErrExists) {
		t.Fatalf("a second create of one id: %v, want ErrExists", err)
	}
}

// TestCreateArrayIdempotentRace: creates racing with one Idempotency-Key
// (each its own array id, as concurrent API requests make) write one
// array; every other gets the winner's record back and writes nothing.
// The record is written under the lease, and a create whose id is taken
// or whose guard failed writes no record.
func TestCreateArrayIdempotentRace(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	k := state.MustKeys(state.DefaultPrefix)
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	key := k.Idempotency("ada", "arr-race")
	const n = 8
	type result struct {
		id      string
		stored  state.IdempotencyRecord
		created bool
		err     error
	}
	results := make(chan result, n)
	for i := range n {
		go func() {
			a := state.Array{ID: "arr-race-" + strconv.Itoa(i), Owner: "ada", Indices: "0-3", MaxRunning: 2, Created: now,
				Template: state.Session{Kind: state.KindBatch, Command: []string{"true"}}}
			idem := state.Idempotency{Key: key, Record: state.IdempotencyRecord{Array: a.ID, RequestHash: "h1", Created: now}, Lease: lease.ID}
			stored, created, err := state.CreateArrayIdempotent(ctx, cli, k, a, idem)
			results <- result{a.ID, stored, created, err}
		}()
	}
	winner := ""
	var losers []result
	for range n {
		r := <-results
		switch {
		case r.err != nil:
			t.Fatalf("create %s: %v", r.id, r.err)
		case r.created && winner != "":
			t.Fatalf("two creates with one key made arrays: %s and %s", winner, r.id)
		case r.created:
			winner = r.id
		default:
			losers = append(losers, r)
		}
	}
	for _, r := range losers {
		if r.stored.Array != winner || r.stored.RequestHash != "h1" {
			t.Errorf("create %s got record %+v back, want the winner's (%s)", r.id, r.stored, winner)
		}
	}
	resp, err := cli.Get(ctx, k.Arrays(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Key) != k.Array(winner) {
		t.Fatalf("arrays after the race: %v (%v), want only %s", resp.Kvs, err, winner)
	}
	rec, err := cli.Get(ctx, key)
	if err != nil || len(rec.Kvs) != 1 || rec.Kvs[0].Lease != int64(lease.ID) {
		t.Fatalf("idempotency record: %v (%v), want one under lease %x", rec.Kvs, err, lease.ID)
	}

	// A taken id with a new key: ErrExists, and no record for that key.
	taken := state.Array{ID: winner, Owner: "ada", Indices: "0", Template: state.Session{Kind: state.KindBatch, Command: []string{"true"}}}
	other := state.Idempotency{Key: k.Idempotency("ada", "arr-other"), Record: state.IdempotencyRecord{Array: winner}, Lease: lease.ID}
	if _, _, err := state.CreateArrayIdempotent(ctx, cli, k, taken, other); !errors.Is(err, state.ErrExists) {
		t.Errorf("create over a taken id: %v, want ErrExists", err)
	}
	// A failed guard: ErrConflict, nothing written.
	fresh := state.Array{ID: "arr-guarded", Owner: "ada", Indices: "0", Template: state.Session{Kind: state.KindBatch, Command: []string{"true"}}}
	guard := clientv3.Compare(clientv3.CreateRevision(k.Volume("arr-missing")), ">", 0)
	if _, _, err := state.CreateArrayIdempotent(ctx, cli, k, fresh, other, guard); !errors.Is(err, state.ErrConflict) {
		t.Errorf("create under a failed guard: %v, want ErrConflict", err)
	}
	for _, key := range []string{other.Key, k.Array("arr-guarded")} {
		if r, _ := cli.Get(ctx, key, clientv3.WithCountOnly()); r.Count != 0 {
			t.Errorf("%s written by a refused create", key)
		}
	}
}
