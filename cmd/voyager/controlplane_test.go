package main

import (
	"io"
	"log/slog"
	"slices"
	"testing"

	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

func TestAdvertisedAddrs(t *testing.T) {
	for _, tc := range []struct {
		listen, advertise string
		want              []string
	}{
		{"127.0.0.1:7070", "", nil},
		{"10.0.0.10:7443", "", []string{"10.0.0.10:7443"}},
		{"0.0.0.0:7071", "10.0.0.21", []string{"10.0.0.21:7071"}},
		{"[::1]:7070", "", nil},
	} {
		if got := advertisedAddrs(tc.listen, tc.advertise); !slices.Equal(got, tc.want) {
			t.Errorf("advertisedAddrs(%q, %q) = %v, want %v", tc.listen, tc.advertise, got, tc.want)
		}
	}
	if got := advertisedAddrs("0.0.0.0:7070", ""); slices.ContainsFunc(got, func(a string) bool { return a == "127.0.0.1:7070" }) {
		t.Errorf("a wildcard listener advertises loopback: %v", got)
	}
}

type recordingDenier struct{ calls [][]runtime.Endpoint }

func (r *recordingDenier) DenyEndpoints(eps []runtime.Endpoint) error {
	r.calls = append(r.calls, slices.Clone(eps))
	return nil
}

// TestGuardDeniesWhatItKnows: the guard denies the configured etcd
// endpoints, every member's client and peer URL and every record's
// addresses, one endpoint per address with its ports, never loopback,
// and rewrites the rules only when the set changes.
func TestGuardDeniesWhatItKnows(t *testing.T) {
	d := &recordingDenier{}
	g := &controlPlaneGuard{rt: d, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		static:  []string{"10.0.0.1:2379", "127.0.0.1:2379"},
		members: []string{"10.0.0.1:2379", "10.0.0.1:2380", "10.0.0.2:2379", "10.0.0.2:2380"}}
	recs := []state.Endpoints{
		{Kind: state.EndpointAPI, Addresses: []string{"10.0.0.10:7443"}},
		{Kind: state.EndpointAgent, Addresses: []string{"10.0.0.21:7071"}},
		{Kind: state.EndpointPlacer, Addresses: []string{"10.0.0.10:7070"}},
	}
	if err := g.apply(recs); err != nil {
		t.Fatal(err)
	}
	want := []runtime.Endpoint{{Addr: "10.0.0.1", Ports: []int{2379, 2380}}, {Addr: "10.0.0.10", Ports: []int{7070, 7443}},
		{Addr: "10.0.0.2", Ports: []int{2379, 2380}}, {Addr: "10.0.0.21", Ports: []int{7071}}}
	if len(d.calls) != 1 || !slices.EqualFunc(d.calls[0], want, func(a, b runtime.Endpoint) bool { return a.Addr == b.Addr && slices.Equal(a.Ports, b.Ports) }) {
		t.Fatalf("denied %v, want %v", d.calls, want)
	}
	if err := g.apply(recs); err != nil || len(d.calls) != 1 {
		t.Errorf("an unchanged set was written again: %d calls", len(d.calls))
	}
	if err := g.apply(recs[:1]); err != nil || len(d.calls) != 2 {
		t.Errorf("an agent gone did not rewrite the rules: %d calls", len(d.calls))
	}
}
