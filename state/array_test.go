package state_test

import (
	"context"
	"errors"
	"reflect"
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
