package lifecycle

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/history"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/sweep"
)

var keys = state.MustKeys(state.DefaultPrefix)

// finish writes n finished sessions (spec and terminal status), finished at
// at, numbered from first, in a few large transactions.
func finish(t testing.TB, cli *clientv3.Client, first, n int, at time.Time) {
	t.Helper()
	ctx := context.Background()
	var ops []clientv3.Op
	flush := func() {
		if len(ops) == 0 {
			return
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
		ops = ops[:0]
	}
	for i := first; i < first+n; i++ {
		id := fmt.Sprintf("s%07d", i)
		code := i % 3
		spec, _ := state.Encode(state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Command: []string{"train", fmt.Sprint(i)}, Created: at.Add(-time.Hour)})
		st, _ := state.Encode(state.Status{Session: id, Phase: state.PhaseSucceeded, ExitCode: &code, Updated: at, Finished: &at})
		ops = append(ops, clientv3.OpPut(keys.Session(id), spec), clientv3.OpPut(keys.Status(id), st))
		if len(ops) >= 120 {
			flush()
		}
	}
	flush()
}

func count(t testing.TB, cli *clientv3.Client) int64 {
	t.Helper()
	resp, err := cli.Get(context.Background(), keys.All(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

func readHistory(t testing.TB, path string) map[string]HistoryRecord {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]HistoryRecord{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec HistoryRecord
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("history line %q: %v", sc.Text(), err)
		}
		out[rec.Session.ID] = rec
	}
	return out
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestRetentionKeepsRecentAndRetiresOld: only terminal sessions older than
// After leave etcd, each with its spec and status in the history.
func TestRetentionKeepsRecentAndRetiresOld(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	finish(t, cli, 0, 10, now.Add(-8*24*time.Hour)) // old: retire
	finish(t, cli, 10, 5, now.Add(-6*24*time.Hour)) // recent: keep
	running, _ := state.Encode(state.Status{Session: "live", Phase: state.PhaseRunning, Updated: now.Add(-30 * 24 * time.Hour)})
	if _, err := cli.Put(ctx, keys.Status("live"), running); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "history", "sessions.jsonl")
	r, err := NewRetention(cli, RetentionConfig{HistoryPath: path, Now: func() time.Time { return now }, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	moved, err := r.Sweep(ctx)
	if err != nil || moved != 10 {
		t.Fatalf("Sweep = %d, %v; want 10 retired", moved, err)
	}
	hist := readHistory(t, path)
	if len(hist) != 10 {
		t.Fatalf("history has %d sessions, want 10", len(hist))
	}
	rec := hist["s0000004"]
	if rec.Session.Command[1] != "4" || rec.Status.ExitCode == nil || *rec.Status.ExitCode != 1 || !rec.Retired.Equal(now) {
		t.Errorf("record = %+v", rec)
	}
	for i := 0; i < 15; i++ {
		id := fmt.Sprintf("s%07d", i)
		resp, _ := cli.Get(ctx, keys.Session(id), clientv3.WithCountOnly())
		if kept := resp.Count == 1; kept != (i >= 10) {
			t.Errorf("%s kept=%v", id, kept)
		}
	}
	if resp, _ := cli.Get(ctx, keys.Status("live"), clientv3.WithCountOnly()); resp.Count != 1 {
		t.Error("a running session was retired")
	}
	if moved, _ := r.Sweep(ctx); moved != 0 {
		t.Errorf("second sweep retired %d, want 0", moved)
	}
	if _, err := NewRetention(cli, RetentionConfig{}); err == nil {
		t.Error("retention without a history file was accepted")
	}
}

// TestRetentionBoundsTheKeyspace: 100,000 sessions finish, 1,000 at a time,
// while the sweeper runs; etcd never holds more than a few batches of them,
// and the history ends with every one.
func TestRetentionBoundsTheKeyspace(t *testing.T) {
	total, round := 100000, 1000
	if testing.Short() {
		total = 5000
	}
	// Debian's etcd in its own process: under -race, an embedded etcd
	// would be instrumented too and make this test five times slower.
	cli := etcdtest.StartExternal(t).Client(t)
	ctx := context.Background()
	clock := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	path := filepath.Join(t.TempDir(), "sessions.jsonl")
	r, err := NewRetention(cli, RetentionConfig{HistoryPath: path, After: time.Hour, Now: func() time.Time { return clock }, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	var peak int64
	for first := 0; first < total; first += round {
		finish(t, cli, first, round, clock)
		clock = clock.Add(30 * time.Minute) // sessions of the round before are now over an hour old
		if _, err := r.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		peak = max(peak, count(t, cli))
	}
	clock = clock.Add(2 * time.Hour)
	if _, err := r.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, cli); n != 0 {
		t.Errorf("%d keys left after the last sweep, want 0", n)
	}
	if peak > int64(4*round) {
		t.Errorf("keyspace peaked at %d keys; want at most %d (two rounds of spec+status)", peak, 4*round)
	}
	hist := readHistory(t, path)
	if len(hist) != total {
		t.Fatalf("history holds %d sessions, want %d", len(hist), total)
	}
	t.Logf("%d sessions retired; keyspace peak %d keys; history %d records", r.Retired(), peak, len(hist))
}

// TestRetentionRunsUnderElection: two sweepers, one history each; only the
// elected one retires, and when it stops the other takes over.
func TestRetentionRunsUnderElection(t *testing.T) {
	cli := etcdtest.New(t)
	now := time.Now()
	finish(t, cli, 0, 20, now.Add(-48*time.Hour))
	dir := t.TempDir()
	mk := func(name string) *Retention {
		r, err := NewRetention(cli, RetentionConfig{HistoryPath: filepath.Join(dir, name), After: time.Hour, Every: 50 * time.Millisecond, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a, b := mk("a.jsonl"), mk("b.jsonl")
	ctxA, stopA := context.WithCancel(context.Background())
	doneA := make(chan error, 1)
	go func() { doneA <- a.Run(ctxA) }()
	waitFor(t, "the first sweeper to retire all 20", func() bool { return a.Retired() == 20 })
	ctxB, stopB := context.WithCancel(context.Background())
	defer stopB()
	doneB := make(chan error, 1)
	go func() { doneB <- b.Run(ctxB) }()
	finish(t, cli, 20, 5, now.Add(-48*time.Hour))
	waitFor(t, "the leader to retire the next 5", func() bool { return a.Retired() == 25 })
	if b.Retired() != 0 {
		t.Errorf("the follower retired %d while not elected", b.Retired())
	}
	stopA()
	if err := <-doneA; err != nil {
		t.Fatal(err)
	}
	finish(t, cli, 25, 5, now.Add(-48*time.Hour))
	waitFor(t, "the second sweeper to take over", func() bool { return b.Retired() == 5 })
	stopB()
	if err := <-doneB; err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRetentionRetiresFinishedArrays: job arrays made and ended by the
// array controller (package sweep). One finished more than After ago
// leaves etcd with every element, its record and theirs in the history;
// one finished recently and one still running stay; one with an element
// record left stays (state.RetireArray compares that none is) until the
// element is gone. The history checker passes every revision.
func TestRetentionRetiresFinishedArrays(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	clock := t0
	now := func() time.Time { return clock }
	start, err := cli.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	ctrl := sweep.New(cli, sweep.Config{Keys: keys, Now: now, Logger: quiet()})
	// mk makes an array of n elements, cap 2, and its first elements.
	mk := func(id string, n int) {
		t.Helper()
		a := state.Array{ID: id, Owner: "ada", Indices: fmt.Sprintf("0-%d", n-1), MaxRunning: 2, Created: clock,
			Template: state.Session{Kind: state.KindBatch, Command: []string{"train", "{index}"}, Owner: "ada"}}
		if err := state.CreateArray(ctx, cli, keys, a); err != nil {
			t.Fatal(err)
		}
		if err := ctrl.Reconcile(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	// end stops array id; the controller cancels its queued elements and
	// marks it finished.
	end := func(id string) {
		t.Helper()
		a, rev, err := state.Get[state.Array](ctx, cli, keys.Array(id))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := state.StopArray(ctx, cli, keys, a, rev, "ada", clock); err != nil {
			t.Fatal(err)
		}
		for range 2 { // stop the elements, then fold their ends
			if err := ctrl.Reconcile(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		if a, _, err := state.Get[state.Array](ctx, cli, keys.Array(id)); err != nil || a.Finished == nil || a.Next != 2 {
			t.Fatalf("array %s after its stop: %+v (%v), want finished with 2 elements made", id, a, err)
		}
	}
	mk("arrold", 5)
	end("arrold")
	mk("arrrun", 3) // never ends
	mk("arrleft", 3)
	end("arrleft")
	// A spec of arrleft's left behind (a create cut short, say): the
	// array must not leave before it.
	stray := state.Session{ID: state.ElementID("arrleft", 9), Owner: "ada", Kind: state.KindBatch, Command: []string{"x"},
		Array: &state.ArrayMember{ID: "arrleft", Index: 9}}
	if _, err := state.Put(ctx, cli, keys.Session(stray.ID), stray); err != nil {
		t.Fatal(err)
	}
	clock = t0.Add(6 * 24 * time.Hour)
	mk("arrnew", 2)
	end("arrnew")

	clock = t0.Add(7*24*time.Hour + time.Hour) // arrold and arrleft are past the 7 days
	path := filepath.Join(t.TempDir(), "sessions.jsonl")
	r, err := NewRetention(cli, RetentionConfig{HistoryPath: path, Now: now, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	moved, err := r.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// arrold's and arrleft's two elements each.
	if moved != 4 || r.RetiredArrays() != 1 {
		t.Fatalf("Sweep retired %d sessions and %d arrays, want 4 and 1 (arrleft waits for its stray spec)", moved, r.RetiredArrays())
	}
	exists := func(key string) bool {
		resp, err := cli.Get(ctx, key, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count > 0
	}
	for key, want := range map[string]bool{
		keys.Array("arrold"): false, keys.Session("arrold-"): false, keys.Status("arrold-"): false,
		keys.Array("arrrun"): true, keys.Status("arrrun-"): true,
		keys.Array("arrnew"): true, keys.Status("arrnew-"): true,
		keys.Array("arrleft"): true, keys.Status("arrleft-"): false,
	} {
		if got := exists(key); got != want {
			t.Errorf("%s exists: %v, want %v", key, got, want)
		}
	}
	// The history: arrold's record with its elements' results, and each
	// retired element's spec and status.
	f, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	arrays, sessions := map[string]state.Array{}, map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(f)), "\n") {
		var rec HistoryRecord
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("history line %q: %v", line, err)
		}
		switch {
		case rec.Array != nil && rec.Session.ID == "":
			arrays[rec.Array.ID] = *rec.Array
		case rec.Array == nil && rec.Session.ID != "" && rec.Status.Phase == state.PhaseStopped:
			sessions[rec.Session.ID] = true
		default:
			t.Errorf("history line is neither an array's nor a session's: %s", line)
		}
	}
	if a := arrays["arrold"]; len(a.Done) != 2 || a.Done["0"].Phase != state.PhaseStopped || a.Stop == nil {
		t.Errorf("arrold in the history: %+v", a)
	}
	for _, id := range []string{"arrold-0", "arrold-1", "arrleft-0", "arrleft-1"} {
		if !sessions[id] {
			t.Errorf("history lacks element %s (has %v)", id, sessions)
		}
	}

	// The stray spec gone, the next sweep retires arrleft.
	if _, err := cli.Delete(ctx, keys.Session(stray.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Sweep(ctx); err != nil || r.RetiredArrays() != 2 || exists(keys.Array("arrleft")) {
		t.Fatalf("second sweep: %v, %d arrays retired, arrleft exists %v; want arrleft retired", err, r.RetiredArrays(), exists(keys.Array("arrleft")))
	}
	// A week later still, arrnew goes too; arrrun never.
	clock = clock.Add(7 * 24 * time.Hour)
	if _, err := r.Sweep(ctx); err != nil || r.RetiredArrays() != 3 || !exists(keys.Array("arrrun")) {
		t.Fatalf("third sweep: %v, %d arrays retired; want 3, arrrun kept", err, r.RetiredArrays())
	}

	last, err := cli.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	res, err := history.Watch(ctx, cli, keys, history.Options{Start: start.Header.Revision + 1, End: last.Header.Revision})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range res.Violations {
		t.Errorf("history: %s", v)
	}
}
