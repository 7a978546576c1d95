package state_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

func TestNewKeys(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		ok     bool
	}{
		{"/voyager", true},
		{"/lab/voyager-2", true},
		{"voyager", false},
		{"/voyager/", false},
		{"/", false},
		{"", false},
		{"/a b", false},
	} {
		_, err := state.NewKeys(tc.prefix)
		if (err == nil) != tc.ok {
			t.Errorf("NewKeys(%q) error = %v, want ok=%v", tc.prefix, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "/voyager") {
			t.Errorf("NewKeys(%q) error %q does not show a valid example", tc.prefix, err)
		}
	}
}

func TestKeysRoundTrip(t *testing.T) {
	k := state.MustKeys("/lab/v")
	if got := k.Session("s1"); got != "/lab/v/sessions/s1" {
		t.Errorf("Session = %q", got)
	}
	for _, key := range []string{k.Session("s1"), k.Pending("s1"), k.Status("s1")} {
		if id, ok := k.SessionID(key); !ok || id != "s1" {
			t.Errorf("SessionID(%q) = %q, %v", key, id, ok)
		}
	}
	for _, key := range []string{k.Node("n1"), k.Ledger("n1"), k.Cordon("n1")} {
		if n, ok := k.NodeName(key); !ok || n != "n1" {
			t.Errorf("NodeName(%q) = %q, %v", key, n, ok)
		}
	}
	if n, id, ok := k.BindingKey(k.Binding("n1", "s1")); !ok || n != "n1" || id != "s1" {
		t.Errorf("BindingKey = %q %q %v", n, id, ok)
	}
	if !strings.HasPrefix(k.Binding("n1", "s1"), k.Bindings("n1")) {
		t.Error("Binding is not under Bindings(node)")
	}
	if strings.HasPrefix(k.Binding("n10", "s1"), k.Bindings("n1")) {
		t.Error("Bindings(n1) must not match node n10")
	}
	if sc, n, ok := k.QuotaKey(k.GroupQuota("vision")); !ok || sc != state.QuotaGroups || n != "vision" {
		t.Errorf("QuotaKey = %q %q %v", sc, n, ok)
	}
	if _, _, ok := k.QuotaKey(k.Quotas() + "teams/x"); ok {
		t.Error("QuotaKey accepted an unknown scope")
	}
	if _, ok := k.SessionID(k.Node("n1")); ok {
		t.Error("SessionID accepted a node key")
	}
	// Near misses: another prefix that starts with this one, a directory
	// that starts with a known one, a directory without its slash, an
	// empty id.
	for _, key := range []string{"/lab/vx/sessions/s1", "/lab/sessions/s1", "/lab/v/sessionsx/s1", "/lab/v/sessions", "/lab/v/sessions/", "/lab/v//sessions/s1", "/lab/v"} {
		if id, ok := k.SessionID(key); ok {
			t.Errorf("SessionID(%q) = %q, true; want false", key, id)
		}
		if n, ok := k.NodeName(strings.Replace(key, "sessions", "nodes", 1)); ok {
			t.Errorf("NodeName(%q) = %q, true; want false", key, n)
		}
	}
	if p, ok := k.ProfileName(k.Profile("a100")); !ok || p != "a100" {
		t.Errorf("ProfileName = %q %v", p, ok)
	}
}

func TestValidateName(t *testing.T) {
	good := []string{"a", "gpu-07", "s01jq2k7w3b8h4x9za5", "node.rack1_a"}
	bad := []string{"", "-a", "a-", "A", "a/b", strings.Repeat("a", 64), "a b"}
	for _, s := range good {
		if err := state.ValidateName("node name", s); err != nil {
			t.Errorf("ValidateName(%q) = %v", s, err)
		}
	}
	for _, s := range bad {
		err := state.ValidateName("node name", s)
		if err == nil || !strings.Contains(err.Error(), "node name") {
			t.Errorf("ValidateName(%q) = %v, want an error naming the field", s, err)
		}
	}
}

func TestNewSessionIDSortsAndIsValid(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)
	var ids []string
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		id, err := state.NewSessionID(t0.Add(time.Duration(i) * time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if err := state.ValidateName("session id", id); err != nil {
			t.Fatal(err)
		}
		if seen[id] {
			t.Fatalf("duplicate id %s", id)
		}
		seen[id] = true
		ids = append(ids, id)
	}
	if !sort.StringsAreSorted(ids) {
		t.Error("ids made at increasing times do not sort in time order")
	}
}

func TestDurationJSON(t *testing.T) {
	var l state.Limits
	if err := json.Unmarshal([]byte(`{"maxRuntime":"90m"}`), &l); err != nil {
		t.Fatal(err)
	}
	if l.MaxRuntime.Std() != 90*time.Minute {
		t.Errorf("MaxRuntime = %v", l.MaxRuntime.Std())
	}
	b, _ := json.Marshal(l)
	if !strings.Contains(string(b), `"1h30m0s"`) {
		t.Errorf("marshal = %s", b)
	}
	err := json.Unmarshal([]byte(`{"maxRuntime":"ninety"}`), &l)
	if err == nil || !strings.Contains(err.Error(), "90m") {
		t.Errorf("bad duration error = %v, want one showing a valid example", err)
	}
	if err := json.Unmarshal([]byte(`{"maxRuntime":5400}`), &l); err == nil {
		t.Error("a bare number was accepted as a duration")
	}
}

func TestQueueEntryParts(t *testing.T) {
	head := state.Resources{GPUs: 1, CPUMilli: 1000}
	w := state.Resources{GPUs: 8}
	q := state.QueueEntry{Request: head, Workers: 2, WorkerRequest: &w}
	parts := q.Parts()
	if len(parts) != 3 || parts[0].GPUs != 1 || parts[1].GPUs != 8 || parts[2].GPUs != 8 {
		t.Errorf("Parts = %+v", parts)
	}
	q.WorkerRequest = nil
	if parts := q.Parts(); parts[2].GPUs != 1 {
		t.Errorf("workers without a request should copy the head's: %+v", parts)
	}
}

func TestCreateSessionIsAtomicAndUnique(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	k := state.MustKeys(state.DefaultPrefix)
	now := time.Now().UTC()
	s := state.Session{ID: "s1", Owner: "ada", Kind: state.KindBatch, Desired: state.DesiredRunning, Created: now,
		Resources: state.Resources{GPUs: 1, CPUMilli: 1000, MemoryMiB: 1024}}
	rev, err := state.CreateSession(ctx, cli, k, s, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{k.Session("s1"), k.Pending("s1"), k.Status("s1")} {
		resp, err := cli.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 1 || resp.Kvs[0].ModRevision != rev {
			t.Errorf("%s not written at revision %d: %+v", key, rev, resp.Kvs)
		}
	}
	st, _, err := state.Get[state.Status](ctx, cli, k.Status("s1"))
	if err != nil || st.Phase != state.PhasePending {
		t.Errorf("status = %+v, %v", st, err)
	}
	q, _, err := state.Get[state.QueueEntry](ctx, cli, k.Pending("s1"))
	if err != nil || q.Request.GPUs != 1 || q.Owner != "ada" {
		t.Errorf("queue entry = %+v, %v", q, err)
	}

	// A second create of the same id writes nothing.
	s2 := s
	s2.Owner = "mallory"
	if _, err := state.CreateSession(ctx, cli, k, s2, now); !errors.Is(err, state.ErrExists) {
		t.Fatalf("second create: %v, want ErrExists", err)
	}
	got, _, err := state.Get[state.Session](ctx, cli, k.Session("s1"))
	if err != nil || got.Owner != "ada" {
		t.Errorf("spec overwritten: %+v %v", got, err)
	}
	if _, _, err := state.Get[state.Session](ctx, cli, k.Session("nope")); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("Get missing = %v, want ErrNotFound", err)
	}
	bad := s
	bad.ID = "Bad/ID"
	if _, err := state.CreateSession(ctx, cli, k, bad, now); err == nil || !strings.Contains(err.Error(), "session id") {
		t.Errorf("invalid id error = %v", err)
	}
}

// seedBound writes session id as bound on node n1 (spec, status Running,
// binding) and returns the binding's create revision.
func seedBound(t *testing.T, cli *clientv3.Client, k state.Keys, id string) int64 {
	t.Helper()
	ctx := context.Background()
	if _, err := state.Put(ctx, cli, k.Session(id), state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Desired: state.DesiredRunning}); err != nil {
		t.Fatal(err)
	}
	if _, err := state.Put(ctx, cli, k.Status(id), state.Status{Session: id, Phase: state.PhaseRunning}); err != nil {
		t.Fatal(err)
	}
	rev, err := state.Put(ctx, cli, k.Binding("n1", id), state.Binding{Session: id, Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// succeed is a Finalizer that ends a batch part with exit code 0.
func succeed(_ state.Session, cur state.PartStatus) (state.Event, state.PartStatus, error) {
	code := 0
	cur.ExitCode = &code
	return state.EventSucceed, cur, nil
}

// TestReleaseIsAtomicIdempotentAndSurvivesContention releases 40 sessions
// of one node at once: every allocation and binding goes, nothing else
// does, and releasing again writes nothing (the binding is gone: ErrStale).
func TestReleaseIsAtomicIdempotentAndSurvivesContention(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	k := state.MustKeys(state.DefaultPrefix)
	l := state.Ledger{Node: "n1", Allocations: map[string]state.Allocation{}}
	revs := map[string]int64{}
	for i := 0; i < 41; i++ {
		id := fmt.Sprintf("s%02d", i)
		l.Allocations[id] = state.Allocation{Owner: "ada", Role: state.RoleSingle, GPUs: []string{"GPU-" + id}, CPUMilli: 1000}
		revs[id] = seedBound(t, cli, k, id)
	}
	if _, err := state.Put(ctx, cli, k.Ledger("n1"), l); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 80)
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func(id string) {
			defer wg.Done()
			errs <- state.Release(ctx, cli, k, "n1", id, revs[id], succeed)
		}(fmt.Sprintf("s%02d", i))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	got, _, err := state.Get[state.Ledger](ctx, cli, k.Ledger("n1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Allocations) != 1 || got.Allocations["s40"].CPUMilli != 1000 {
		t.Fatalf("ledger after 40 releases = %+v, want only s40", got.Allocations)
	}
	resp, err := cli.Get(ctx, k.Bindings("n1"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 1 {
		t.Fatalf("%d bindings left (err %v), want 1", resp.Count, err)
	}
	// The release reports the part's end; the status is the merger's.
	p, _, err := state.Get[state.PartStatus](ctx, cli, k.Part("n1", "s07"))
	if err != nil || p.Phase != state.PhaseSucceeded || p.ExitCode == nil || *p.ExitCode != 0 || p.BindingRevision != revs["s07"] {
		t.Errorf("part of a released session = %+v, %v", p, err)
	}
	if st, _, _ := state.Get[state.Status](ctx, cli, k.Status("s07")); st.Phase != state.PhaseRunning {
		t.Errorf("a release wrote the status: %s", st.Phase)
	}
	// A repeat finds its binding gone and writes nothing; the last
	// release deletes the emptied ledger.
	if err := state.Release(ctx, cli, k, "n1", "s07", revs["s07"], succeed); !errors.Is(err, state.ErrStale) {
		t.Errorf("second release = %v, want ErrStale", err)
	}
	if err := state.Release(ctx, cli, k, "n1", "s40", revs["s40"], nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := state.Get[state.Ledger](ctx, cli, k.Ledger("n1")); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("empty ledger not deleted: %v", err)
	}
	if _, _, err := state.Get[state.PartStatus](ctx, cli, k.Part("n1", "s40")); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("a release without a finalizer wrote a part: %v", err)
	}
}

// TestReleaseOfARetiredSessionTakesItsPart: a part still bound when its
// session was retired (a Ray worker stopping after its head's end, past
// retention) is released with nothing to merge its end into: the release
// deletes the part with the binding, rather than leave a part saying the
// container still stops (the checker's container-without-binding).
func TestReleaseOfARetiredSessionTakesItsPart(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	k := state.MustKeys(state.DefaultPrefix)
	rev := seedBound(t, cli, k, "s1")
	if _, err := state.Put(ctx, cli, k.Part("n1", "s1"), state.PartStatus{Session: "s1", Node: "n1", Phase: state.PhaseStopping, BindingRevision: rev}); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, k.Session("s1")); err != nil { // retired
		t.Fatal(err)
	}
	if err := state.Release(ctx, cli, k, "n1", "s1", rev, succeed); err != nil {
		t.Fatal(err)
	}
	if _, _, err := state.Get[state.PartStatus](ctx, cli, k.Part("n1", "s1")); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("the retired session's part outlived its binding: %v", err)
	}
}
