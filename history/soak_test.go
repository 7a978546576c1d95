package history_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/voyager-gpu/voyager/history"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/lifecycle"
	"github.com/voyager-gpu/voyager/merger"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

var (
	soakBinds = flag.Int64("soak.binds", 20000, "binds the soak runs before it stops (make soak: 1,000,000)")
	soakSeed  = flag.Uint64("soak.seed", 0, "random seed of the soak; 0: from the clock (logged)")
	soakChaos = flag.Bool("soak.chaos", true, "kill placers and agents and stop sessions at random (false: measure the soak's own pace)")
)

const (
	soakNodes     = 6
	soakPlacers   = 3
	soakInFlight  = 80 // live sessions the submitter keeps: about what the nodes hold, so that few wait
	soakUsers     = 8
	soakAgentTTL  = 2 * time.Second
	soakPlacerTTL = 2 * time.Second
)

// soakProc is one running component that chaos can kill: its own etcd
// client, so that killing it cuts its connection and lets its lease expire.
type soakProc struct {
	cancel context.CancelFunc
	cli    *clientv3.Client
	done   chan struct{}
}

// leave stops it the orderly way: it returns from Run (a placer revokes
// its membership lease), then its connection closes.
func (p *soakProc) leave() {
	p.cancel()
	<-p.done
	_ = p.cli.Close()
}

func (p *soakProc) kill() {
	_ = p.cli.Close() // a cut connection first: the lease is not revoked, it expires
	p.cancel()
	<-p.done
}

// TestSoak runs placers, node agents (on the in-memory runtime), the
// lifecycle controller and users against one real etcd, with chaos at
// random moments: placers killed and started, agents killed (their leases
// expire and their sessions are lost and re-queued) and restarted, user
// stops, preemptions of Ray gangs that span nodes of different placers,
// restarts after failures, max-runtime evictions. The history checker
// follows the whole history from the first revision and must find no
// violation. -soak.binds sets the length (make soak: 1,000,000).
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("the soak runs in make test, not in -short")
	}
	seed := *soakSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("soak seed %d (rerun with -soak.seed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	var rngMu sync.Mutex
	rnd := func(n int) int { rngMu.Lock(); defer rngMu.Unlock(); return rng.IntN(n) }

	// Debian's etcd in its own process: under the race detector only
	// Voyager's code is instrumented, which makes the soak several times
	// cheaper than with the embedded server.
	c := etcdtest.StartExternal(t)
	admin := c.Client(t)
	k := state.MustKeys("/soak")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	newClient := func() *clientv3.Client {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		return cli
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	began := time.Now()

	// The checker, from the first revision.
	r0, err := admin.Get(ctx, k.All(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	var checked, binds atomic.Int64
	var vmu sync.Mutex
	var violations []history.Violation
	checkCtx, stopCheck := context.WithCancel(ctx)
	checkDone := make(chan history.Result, 1)
	go func() {
		res, err := history.Watch(checkCtx, admin, k, history.Options{
			Start:      r0.Header.Revision,
			OnRevision: func(rev, b int64) { checked.Store(rev); binds.Store(b) },
			OnViolation: func(v history.Violation) {
				vmu.Lock()
				violations = append(violations, v)
				vmu.Unlock()
			},
		})
		if err != nil {
			t.Errorf("checker: %v", err)
		}
		checkDone <- res
	}()
	// Compaction only behind the checker.
	go func() {
		for ctx.Err() == nil {
			time.Sleep(2 * time.Second)
			if rev := checked.Load() - 1000; rev > r0.Header.Revision {
				_, _ = admin.Compact(ctx, rev)
			}
		}
	}()

	run := func(f func(ctx context.Context, cli *clientv3.Client)) *soakProc {
		cli := newClient()
		pctx, pcancel := context.WithCancel(ctx)
		p := &soakProc{cancel: pcancel, cli: cli, done: make(chan struct{})}
		go func() { defer close(p.done); f(pctx, cli) }()
		return p
	}
	// One runtime per node, kept across its agent's restarts: the
	// containers outlive the agent, as containerd's do.
	fakes := make([]*runtime.Fake, soakNodes)
	for i := range fakes {
		fakes[i] = runtime.NewFake(nil, "busybox")
		fakes[i].Exit = func(s runtime.Spec) (int, bool) {
			if v, ok := s.Env["SOAK_EXIT"]; ok {
				code, _ := strconv.Atoi(v)
				return code, true
			}
			return 0, false // runs until stopped
		}
	}
	agent := func(i int) *soakProc {
		name := fmt.Sprintf("n%02d", i)
		return run(func(ctx context.Context, cli *clientv3.Client) {
			gpus, _ := nodeagent.SimulatedGPUs(name, "8xA100-80GB")
			dir := t.TempDir()
			a := nodeagent.New(nodeagent.Config{Node: name, Address: "127.0.0.1", Keys: k, Client: cli, Runtime: fakes[i],
				GPUs: gpus, Simulated: true, CPUMilli: 16000, MemoryMiB: 65536,
				Ports: state.PortRange{First: 41000 + 100*i, Last: 41099 + 100*i}, LeaseTTL: soakAgentTTL,
				Image: "busybox", HomeDir: dir + "/home", LogDir: dir + "/logs", StopGrace: 10 * time.Millisecond,
				Logger: quiet, Resync: time.Second, RestartBackoff: 10 * time.Millisecond, RestartBackoffMax: 50 * time.Millisecond,
				ActivityEvery: time.Hour})
			_ = a.Run(ctx)
		})
	}
	placerProc := func() *soakProc {
		return run(func(ctx context.Context, cli *clientv3.Client) {
			// A placer process runs the status merger beside the placer.
			m := merger.New(cli, merger.Config{Keys: k, Logger: quiet})
			merged := make(chan struct{})
			go func() { defer close(merged); _ = m.Run(ctx) }()
			p := placer.New(cli, placer.Config{Keys: k, LeaseTTL: soakPlacerTTL, Logger: quiet, Tick: 200 * time.Millisecond})
			_ = p.Run(ctx)
			<-merged
		})
	}
	var mu sync.Mutex
	agents := make([]*soakProc, soakNodes)
	for i := range agents {
		agents[i] = agent(i)
	}
	placers := []*soakProc{}
	for i := 0; i < soakPlacers; i++ {
		placers = append(placers, placerProc())
	}
	// Retention removes finished sessions as it does in production, and
	// keeps a million binds from piling up in etcd and every cache.
	retDir := t.TempDir()
	ret := run(func(ctx context.Context, cli *clientv3.Client) {
		r, err := lifecycle.NewRetention(cli, lifecycle.RetentionConfig{Keys: k, After: 2 * time.Second, Every: time.Second,
			HistoryPath: retDir + "/history.jsonl", Logger: quiet})
		if err != nil {
			t.Error(err)
			return
		}
		_ = r.Run(ctx)
	})
	lc := run(func(ctx context.Context, cli *clientv3.Client) {
		ctl := lifecycle.NewController(cli, lifecycle.ControllerConfig{Keys: k, Logger: quiet, Every: 100 * time.Millisecond,
			StopWarning: 50 * time.Millisecond, PreemptGrace: 50 * time.Millisecond, MaxRuntime: time.Hour})
		_ = ctl.Run(ctx)
	})
	// The usage accountant: every ended attempt's GPU-hours, which the
	// checker's accrual rules hold to once each.
	acct := run(func(ctx context.Context, cli *clientv3.Client) {
		_ = lifecycle.NewAccountant(cli, lifecycle.AccountantConfig{Keys: k, Logger: quiet, CursorEvery: time.Second}).Run(ctx)
	})

	// Users: keep soakInFlight sessions live; stop some at random.
	var submitted atomic.Int64
	// Live sessions (bindings and queue entries), counted every 20 ms
	// for all users.
	var liveN atomic.Int64
	liveN.Store(soakInFlight)
	go func() {
		for ctx.Err() == nil {
			r, err := admin.Txn(ctx).Then(clientv3.OpGet(k.AllBindings(), clientv3.WithPrefix(), clientv3.WithCountOnly()),
				clientv3.OpGet(k.PendingDir(), clientv3.WithPrefix(), clientv3.WithCountOnly())).Commit()
			if err == nil {
				liveN.Store(r.Responses[0].GetResponseRange().Count + r.Responses[1].GetResponseRange().Count)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	live := func() int64 { return liveN.Load() }
	var wg sync.WaitGroup
	// Several users at once: one etcd round trip at a time would pace
	// the soak by its latency, not by what the components can do.
	for user := 0; user < soakUsers; user++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for binds.Load() < *soakBinds && ctx.Err() == nil {
				if live() >= soakInFlight {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				for j := 0; j < 5; j++ {
					n := submitted.Add(1)
					s := state.Session{ID: fmt.Sprintf("s%07d", n), Owner: fmt.Sprintf("u%d", rnd(5)), Kind: state.KindBatch,
						Desired: state.DesiredRunning, Image: "busybox", Command: []string{"job"},
						Resources: state.Resources{GPUs: 1 + rnd(2), CPUMilli: 500, MemoryMiB: 1024},
						Env:       map[string]string{"SOAK_EXIT": "0"}, Priority: rnd(3) * 10, Preemptible: rnd(2) == 0}
					switch roll := rnd(100); {
					case roll < 15: // fails, restarts under OnFailure
						s.Env["SOAK_EXIT"] = "1"
						s.Restart = state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 2, Backoff: state.Duration(10 * time.Millisecond)}
					case roll < 30: // runs until stopped (by its user, its max runtime, a preemption or its node's loss)
						delete(s.Env, "SOAK_EXIT")
						s.Limits.MaxRuntime = state.Duration(time.Duration(200+rnd(800)) * time.Millisecond)
						s.Restart = state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 1}
					case roll < 40: // a Ray gang across nodes, likely of different placers
						delete(s.Env, "SOAK_EXIT")
						s.Ray = &state.Ray{Workers: 1 + rnd(3)}
						s.Limits.MaxRuntime = state.Duration(time.Duration(200+rnd(800)) * time.Millisecond)
					}
					if _, err := state.CreateSession(ctx, admin, k, s, time.Now()); err != nil && ctx.Err() == nil {
						t.Errorf("create %s: %v", s.ID, err)
					}
				}
			}
		}()
	}
	// Chaos.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for *soakChaos && binds.Load() < *soakBinds && ctx.Err() == nil {
			time.Sleep(time.Duration(5+rnd(20)) * time.Millisecond)
			switch roll := rnd(1000); {
			case roll < 300: // a user stops a random recent session
				if n := submitted.Load(); n > 0 {
					id := fmt.Sprintf("s%07d", n-int64(rnd(int(min(n, 200)))))
					_, _ = state.StopSession(ctx, admin, k, id, "soak", time.Now())
				}
			case roll < 306: // a placer leaves or is killed; another joins
				mu.Lock()
				i := rnd(len(placers))
				if rnd(2) == 0 {
					placers[i].leave()
				} else {
					placers[i].kill()
				}
				placers[i] = placerProc()
				mu.Unlock()
			case roll < 310: // an agent is killed: its lease expires, later it comes back
				i := rnd(soakNodes)
				mu.Lock()
				a := agents[i]
				mu.Unlock()
				if a == nil {
					continue
				}
				a.kill()
				mu.Lock()
				agents[i] = nil
				mu.Unlock()
				wg.Add(1)
				go func() {
					defer wg.Done()
					time.Sleep(soakAgentTTL + time.Duration(rnd(2000))*time.Millisecond)
					mu.Lock()
					defer mu.Unlock()
					if ctx.Err() == nil {
						agents[i] = agent(i)
					}
				}()
			}
		}
	}()
	// Progress.
	census := func() string {
		r, err := admin.Get(ctx, k.StatusDir(), clientv3.WithPrefix())
		if err != nil {
			return err.Error()
		}
		n := map[string]int{}
		example := map[string]string{}
		for _, kv := range r.Kvs {
			st, _ := state.Decode[state.Status](kv.Value)
			if !st.Phase.Terminal() {
				n[string(st.Phase)+"/"+st.Reason]++
				example[string(st.Phase)+"/"+st.Reason] = st.Message
			}
		}
		phases := map[string]state.Status{}
		for _, kv := range r.Kvs {
			st, _ := state.Decode[state.Status](kv.Value)
			phases[st.Session] = st
		}
		bs, err := admin.Get(ctx, k.AllBindings(), clientv3.WithPrefix(), clientv3.WithRev(r.Header.Revision))
		if err != nil {
			return err.Error()
		}
		byPhase := map[string]int{}
		for _, kv := range bs.Kvs {
			b, _ := state.Decode[state.Binding](kv.Value)
			st := phases[b.Session]
			byPhase[string(b.Role)+":"+string(st.Phase)+"/"+st.Reason]++
		}
		n["bindings "+fmt.Sprint(byPhase)] = len(bs.Kvs)
		nodes, _ := admin.Get(ctx, k.Nodes(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return fmt.Sprintf("%v; %d nodes; e.g. %q", n, nodes.Count, example["Pending/Capacity"])
	}
	for tick := 0; binds.Load() < *soakBinds && ctx.Err() == nil && !t.Failed(); tick++ {
		time.Sleep(time.Second)
		if testing.Verbose() && tick%10 == 9 {
			t.Logf("live sessions by phase/reason: %s", census())
		}
		if testing.Verbose() {
			vmu.Lock()
			t.Logf("%s: %d binds, %d submitted, checked up to revision %d, %d violations", time.Since(began).Round(time.Second), binds.Load(), submitted.Load(), checked.Load(), len(violations))
			vmu.Unlock()
		}
	}
	wg.Wait()
	// Nothing is stuck: with every agent back, every session still live
	// is stopped, and each must end (a stop racing an eviction or a
	// back-off once left sessions Pending forever).
	stuck := map[string]state.Status{}
	deadline := time.Now().Add(2 * time.Minute)
	for stopped := map[string]bool{}; time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		r, err := admin.Get(ctx, k.StatusDir(), clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		clear(stuck)
		for _, kv := range r.Kvs {
			st, err := state.Decode[state.Status](kv.Value)
			if err != nil || st.Phase.Terminal() {
				continue
			}
			stuck[st.Session] = st
			if !stopped[st.Session] {
				// Not found: it ended and was retired since the list; if
				// its status stays, it is reported stuck below.
				if _, err := state.StopSession(ctx, admin, k, st.Session, "soak-end", time.Now()); err != nil && !errors.Is(err, state.ErrNotFound) {
					t.Errorf("stop %s at the end: %v", st.Session, err)
				}
				stopped[st.Session] = true
			}
		}
		if len(stuck) == 0 {
			break
		}
	}
	for id, st := range stuck {
		t.Errorf("session %s stuck after its stop: %s/%s %q", id, st.Phase, st.Reason, st.Message)
	}
	mu.Lock()
	for _, p := range append(append([]*soakProc{lc, ret, acct}, placers...), agents...) {
		if p != nil {
			p.kill()
		}
	}
	mu.Unlock()
	// Read the history to its end.
	end, err := admin.Put(ctx, k.Profile("soak-end"), "{}")
	if err != nil {
		t.Fatal(err)
	}
	for checked.Load() < end.Header.Revision && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	stopCheck()
	res := <-checkDone
	elapsed := time.Since(began)
	t.Logf("soak: %d binds, %d sessions, %d revisions checked, %d violations, %s (%.0f binds/s)",
		res.Binds, submitted.Load(), res.Revisions, res.Count, elapsed.Round(time.Millisecond), float64(res.Binds)/elapsed.Seconds())
	for i, v := range res.Violations {
		if i == 20 {
			t.Errorf("… and %d more", res.Count-20)
			break
		}
		t.Errorf("violation: %s", v)
	}
	if res.Binds < *soakBinds {
		t.Errorf("the checker saw %d binds, want at least %d", res.Binds, *soakBinds)
	}
	// The accountant counted attempts (its rules above held for each).
	days, err := admin.Get(context.Background(), k.GPUHoursDir(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	attempts := 0
	for _, kv := range days.Kvs {
		if d, err := state.Decode[state.UsageDay](kv.Value); err == nil {
			attempts += d.Attempts
		}
	}
	t.Logf("soak: the usage accountant counted %d attempt-days", attempts)
	if attempts == 0 {
		t.Error("the usage accountant counted no attempt")
	}
}
