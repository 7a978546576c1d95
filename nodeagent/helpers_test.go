package nodeagent_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/merger"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
	"github.com/voyager-gpu/voyager/state"
)

func TestMain(m *testing.M) { os.Exit(runtimetest.Main(m)) }

var keys = state.MustKeys("/voyager")

const node = "gpu-01"

// quietLogger keeps test output to warnings.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel()}))
}

// testConfig is an agent config over cli and rt with short timings.
func testConfig(t testing.TB, cli *clientv3.Client, rt runtime.Runtime) nodeagent.Config {
	gpus, err := nodeagent.SimulatedGPUs(node, "2xA100-80GB")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	return nodeagent.Config{
		Node: node, Address: "127.0.0.1", Keys: keys, Client: cli, Runtime: rt,
		GPUs: gpus, Simulated: true, CPUMilli: 2000, MemoryMiB: 4096,
		// Above the ephemeral range and apart from runtimetest.FreePort.
		// An 8 s lease, fenced after 6 s without a renewal (renewed every
		// 2 s, so an etcd that answers nothing for 4 s fences nothing):
		// etcd stalls on the shared CI machine, and 2 s leases were lost
		// there. The fencing tests set their own timings.
		Ports: state.PortRange{First: 61000, Last: 61999}, LeaseTTL: 8 * time.Second,
		FenceAfter: 6 * time.Second, FenceGrace: time.Second,
		Image: "busybox", HomeDir: dir + "/home", LogDir: dir + "/logs", StopGrace: 500 * time.Millisecond,
		Logger: quietLogger(), Resync: time.Second,
	}
}

// runAgent runs an agent until the test ends (or stop is called), with a
// status merger beside it, as a placer process runs one: the agent
// reports parts, the merger writes the statuses that tests read. Agents
// of one test each bring their own; mergers are safe side by side.
func runAgent(t testing.TB, cfg nodeagent.Config) (a *nodeagent.Agent, stop func()) {
	a = nodeagent.New(cfg)
	m := merger.New(cfg.Client, merger.Config{Keys: cfg.Keys, Logger: cfg.Logger})
	ctx, cancel := context.WithCancel(context.Background())
	mctx, mcancel := context.WithCancel(context.Background())
	done, mdone := make(chan error, 1), make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	go func() { mdone <- m.Run(mctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("agent Run: %v", err)
			}
			mcancel()
			if err := <-mdone; err != nil {
				t.Errorf("merger Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return a, stop
}

// bind creates session s and binds it to node the way a placer does: one
// transaction that consumes its queue entry, writes the ledger allocation,
// the binding and a Bound status.
func bind(t testing.TB, cli *clientv3.Client, s state.Session, b state.Binding) state.Binding {
	t.Helper()
	return bindAll(t, cli, []state.Session{s}, []state.Binding{b})[0]
}

// bindAll creates sessions ss (unless they exist) and binds each to node with its binding of
// bs in one transaction, as a placer binds a batch: every queue entry
// consumed, the ledger allocations, bindings and Bound statuses written.
func bindAll(t testing.TB, cli *clientv3.Client, ss []state.Session, bs []state.Binding) []state.Binding {
	t.Helper()
	ctx := context.Background()
	now := time.Now().UTC()
	bs = slices.Clone(bs)
	for i := range ss {
		s, b := &ss[i], &bs[i]
		if s.Created.IsZero() {
			s.Created = now
		}
		if s.Desired == "" {
			s.Desired = state.DesiredRunning
		}
		// A session the API created (with its queue entry) is bound as it is.
		if r, err := cli.Get(ctx, keys.Session(s.ID), clientv3.WithCountOnly()); err != nil {
			t.Fatal(err)
		} else if r.Count == 0 {
			if _, err := state.CreateSession(ctx, cli, keys, *s, now); err != nil {
				t.Fatal(err)
			}
		}
		pr, err := cli.Get(ctx, keys.Pending(s.ID))
		if err != nil || len(pr.Kvs) == 0 {
			t.Fatalf("read pending: %v", err)
		}
		b.Session, b.Node, b.QueueRevision = s.ID, node, pr.Kvs[0].ModRevision
		if b.Role == "" {
			b.Role = state.RoleSingle
		}
		b.Bound = now
	}
	for attempt := 0; ; attempt++ {
		l, rev, err := state.Get[state.Ledger](ctx, cli, keys.Ledger(node))
		if err != nil && !errors.Is(err, state.ErrNotFound) {
			t.Fatal(err)
		}
		if l.Allocations == nil {
			l = state.Ledger{Node: node, Allocations: map[string]state.Allocation{}}
		}
		var placements []state.Placement
		for i, s := range ss {
			b := bs[i]
			l.Allocations[s.ID] = state.Allocation{Owner: s.Owner, Role: b.Role, GPUs: b.GPUs, CPUMilli: b.CPUMilli, MemoryMiB: b.MemoryMiB, Ports: b.Ports}
			placements = append(placements, state.Placement{
				Session: s.ID, PendingRevision: b.QueueRevision, Bindings: []state.Binding{b}, Secrets: specSecretsOf(t, cli, s.ID),
				Status: state.Status{Session: s.ID, Phase: state.PhaseBound, Nodes: []string{node}, Attempt: b.Attempt, Created: s.Created, Updated: now, Bound: &now,
					Elastic: boundElastic(s, b)},
			})
		}
		nr, err := cli.Get(ctx, keys.Node(node))
		if err != nil {
			t.Fatal(err)
		}
		var nodeRev int64 // 0: the bind requires the node key absent, as read
		if len(nr.Kvs) > 0 {
			nodeRev = nr.Kvs[0].ModRevision
		}
		cmps, ops, err := state.BindOps(keys, []state.LedgerWrite{{Node: node, ReadRevision: rev, NodeRevision: nodeRev, Ledger: l}}, placements)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			t.Fatal(err)
		}
		if resp.Succeeded {
			return bs
		}
		if attempt > 10 {
			t.Fatal("bind: ledger kept changing")
		}
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	last := ""
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if msg != "" {
			last = msg
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s; last seen: %s", d, what, last)
		}
		time.Sleep(20 * time.Millisecond) // polling, bounded by deadline
	}
}

// waitPhase waits for session id to reach phase and returns its status.
func waitPhase(t testing.TB, cli *clientv3.Client, id string, phase state.Phase, d time.Duration) state.Status {
	t.Helper()
	var st state.Status
	waitFor(t, fmt.Sprintf("%s to be %s", id, phase), d, func() (bool, string) {
		var err error
		st, _, err = state.Get[state.Status](context.Background(), cli, keys.Status(id))
		if err != nil {
			return false, err.Error()
		}
		return st.Phase == phase, fmt.Sprintf("%s %s %s", st.Phase, st.Reason, st.Message)
	})
	return st
}

// gone reports whether key is absent.
func gone(t testing.TB, cli *clientv3.Client, key string) bool {
	t.Helper()
	resp, err := cli.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Kvs) == 0
}

// listen serves HTTP on a free port until the test ends, standing in for
// Jupyter in tests with the fake runtime. It returns the port.
func listen(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(302) })}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().(*net.TCPAddr).Port
}

// freePort returns a port for a session to publish (runtimetest.FreePort:
// above the ephemeral range, so no other test's server is given it).
func freePort(t testing.TB) int {
	t.Helper()
	return runtimetest.FreePort(t)
}

// logLevel is warn unless VOYAGER_TEST_LOG=debug asks for everything.
func logLevel() slog.Level {
	if os.Getenv("VOYAGER_TEST_LOG") == "debug" {
		return slog.LevelDebug
	}
	return slog.LevelWarn
}

// secretURL returns the full URL name of session id that the agent of
// node published under secrets/, failing the test if there is none.
func secretURL(t testing.TB, cli *clientv3.Client, id, name string) string {
	t.Helper()
	sec, _, err := state.Get[state.Secrets](context.Background(), cli, keys.Secret(node, id))
	if err != nil || sec.URLs[name] == "" {
		t.Fatalf("secrets of %s on %s: %+v, %v; want a %s URL", id, node, sec, err, name)
	}
	return sec.URLs[name]
}

// boundElastic is what a placer's bind writes in an elastic job's status:
// its range at the size bound (nil for other sessions).
func boundElastic(s state.Session, b state.Binding) *state.Elastic {
	if s.Elastic == nil {
		return nil
	}
	el := *s.Elastic
	el.Size = len(b.GPUs)
	return &el
}
