package placer

import (
	"context"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/voyager-gpu/voyager/state"
)

// sim is a simulated cluster on a real etcd: node inventories under leases
// (what agents would write), sessions created through the state package
// (what the API would do), and checks over what placers wrote.
type sim struct {
	t   testing.TB
	cli *clientv3.Client
	k   state.Keys
	// leases of the simulated agents, by node
	mu     sync.Mutex
	leases map[string]clientv3.LeaseID
}

func newSim(t testing.TB, cli *clientv3.Client) *sim {
	return &sim{t: t, cli: cli, k: state.MustKeys(state.DefaultPrefix), leases: map[string]clientv3.LeaseID{}}
}

// addNodes registers count nodes of gpus GPUs each, every node under its
// own lease (kept alive until the test ends or the node is killed).
func (s *sim) addNodes(ctx context.Context, prefix string, count, gpus int) []string {
	s.t.Helper()
	var names []string
	for i := 0; i < count; i++ {
		name := fmt.Sprintf("%s%04d", prefix, i)
		n := gpuNode(name, gpus, "NVIDIA A100-SXM4-80GB")
		n.Simulated = true
		n.Registered = time.Now().UTC()
		lease, err := s.cli.Grant(ctx, 5)
		if err != nil {
			s.t.Fatal(err)
		}
		ka, err := s.cli.KeepAlive(ctx, lease.ID)
		if err != nil {
			s.t.Fatal(err)
		}
		go func() {
			for range ka {
			}
		}()
		v, _ := state.Encode(n)
		if _, err := s.cli.Put(ctx, s.k.Node(name), v, clientv3.WithLease(lease.ID)); err != nil {
			s.t.Fatal(err)
		}
		s.mu.Lock()
		s.leases[name] = lease.ID
		s.mu.Unlock()
		names = append(names, name)
	}
	return names
}

// killNode revokes a node's lease: its agent died, and etcd drops its key.
func (s *sim) killNode(ctx context.Context, name string) {
	s.t.Helper()
	s.mu.Lock()
	id := s.leases[name]
	s.mu.Unlock()
	if _, err := s.cli.Revoke(ctx, id); err != nil {
		s.t.Fatal(err)
	}
}

// submit creates sessions as the API would; it returns their ids.
func (s *sim) submit(ctx context.Context, owner string, sizes []int, mut func(*state.Session)) []string {
	s.t.Helper()
	var ids []string
	for _, g := range sizes {
		now := time.Now().UTC()
		id, err := state.NewSessionID(now)
		if err != nil {
			s.t.Fatal(err)
		}
		sess := state.Session{ID: id, Owner: owner, Kind: state.KindBatch, Desired: state.DesiredRunning, Created: now,
			Resources: state.Resources{GPUs: g, CPUMilli: int64(1000 * max(g, 1)), MemoryMiB: int64(4096 * max(g, 1))}}
		if mut != nil {
			mut(&sess)
		}
		if _, err := state.CreateSession(ctx, s.cli, s.k, sess, now); err != nil {
			s.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// world is everything placers wrote, read at one revision.
type world struct {
	ledgers  map[string]state.Ledger
	bindings map[string][]state.Binding // by session
	status   map[string]state.Status
	pending  map[string]bool
}

func (s *sim) read(ctx context.Context) world {
	s.t.Helper()
	resp, err := s.cli.Get(ctx, s.k.All(), clientv3.WithPrefix())
	if err != nil {
		s.t.Fatal(err)
	}
	w := world{ledgers: map[string]state.Ledger{}, bindings: map[string][]state.Binding{}, status: map[string]state.Status{}, pending: map[string]bool{}}
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		switch {
		case len(key) > len(s.k.Ledgers()) && key[:len(s.k.Ledgers())] == s.k.Ledgers():
			l, err := state.Decode[state.Ledger](kv.Value)
			if err != nil {
				s.t.Fatal(err)
			}
			w.ledgers[key[len(s.k.Ledgers()):]] = l
		case len(key) > len(s.k.AllBindings()) && key[:len(s.k.AllBindings())] == s.k.AllBindings():
			b, err := state.Decode[state.Binding](kv.Value)
			if err != nil {
				s.t.Fatal(err)
			}
			w.bindings[b.Session] = append(w.bindings[b.Session], b)
		case len(key) > len(s.k.StatusDir()) && key[:len(s.k.StatusDir())] == s.k.StatusDir():
			st, err := state.Decode[state.Status](kv.Value)
			if err != nil {
				s.t.Fatal(err)
			}
			w.status[st.Session] = st
		case len(key) > len(s.k.PendingDir()) && key[:len(s.k.PendingDir())] == s.k.PendingDir():
			w.pending[key[len(s.k.PendingDir()):]] = true
		}
	}
	return w
}

// check verifies the invariants over what was written: no device held
// twice, no node over capacity, bindings and ledgers agree, every bound
// session has exactly its parts and no pending entry.
func (w world) check(gpusPerNode int) error {
	seen := map[string]string{}
	for node, l := range w.ledgers {
		if len(l.GPUOwners()) > gpusPerNode {
			return fmt.Errorf("node %s has %d GPUs allocated", node, len(l.GPUOwners()))
		}
		cpu, mem := l.Used()
		if cpu > 128000 || mem > 1<<20 {
			return fmt.Errorf("node %s over CPU or memory: %d %d", node, cpu, mem)
		}
		for id, a := range l.Allocations {
			for _, g := range a.GPUs {
				if prev, dup := seen[g]; dup {
					return fmt.Errorf("GPU %s allocated to %s and %s", g, prev, id)
				}
				seen[g] = id
			}
			found := false
			for _, b := range w.bindings[id] {
				if b.Node == node {
					found = true
					if fmt.Sprint(b.GPUs) != fmt.Sprint(a.GPUs) {
						return fmt.Errorf("binding of %s on %s names %v, ledger %v", id, node, b.GPUs, a.GPUs)
					}
				}
			}
			if !found {
				return fmt.Errorf("ledger of %s holds %s without a binding", node, id)
			}
		}
	}
	for id, bs := range w.bindings {
		for _, b := range bs {
			if _, ok := w.ledgers[b.Node].Allocations[id]; !ok {
				return fmt.Errorf("binding %s/%s without a ledger allocation", b.Node, id)
			}
		}
		if w.pending[id] {
			return fmt.Errorf("session %s is both bound and pending", id)
		}
		if st := w.status[id]; st.Phase != state.PhaseBound {
			return fmt.Errorf("bound session %s has status %s", id, st.Phase)
		}
	}
	return nil
}

// runPlacer starts a placer with its own client (so it can be killed by
// closing the client) and returns a stop func. Each of prepare is applied
// to the client before the placer is made (benchmarks wrap its KV).
func runPlacer(t testing.TB, endpoint string, cfg Config, prepare ...func(*clientv3.Client)) (*Placer, func(), *clientv3.Client) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range prepare {
		f(cli)
	}
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	p := New(cli, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("placer %s: %v", p.ID(), err)
			}
			_ = cli.Close()
		})
	}
	t.Cleanup(stop)
	return p, stop, cli
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	eventuallyEvery(t, timeout, 20*time.Millisecond, what, cond)
}

// eventuallyEvery is eventually with a chosen poll interval, for costly
// conditions that should not steal CPU from what they measure.
func eventuallyEvery(t testing.TB, timeout, every time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(every)
	}
}

func mixedSizes(rng *rand.Rand, n int) []int {
	sizes := make([]int, n)
	for i := range sizes {
		sizes[i] = []int{1, 1, 1, 2, 2, 4, 8}[rng.Intn(7)]
	}
	return sizes
}
