package history_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/voyager-gpu/voyager/history"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/lifecycle"
	"github.com/voyager-gpu/voyager/merger"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/sweep"
)

var (
	soakBinds     = flag.Int64("soak.binds", 4000, "binds the soak runs before it stops (make test: the default, under the race detector; make soak: 1,000,000)")
	soakSeed      = flag.Uint64("soak.seed", 0, "random seed of the soak; 0: from the clock (logged)")
	soakChaos     = flag.Bool("soak.chaos", true, "kill placers and agents and stop sessions at random (false: measure the soak's own pace)")
	soakEtcd      = flag.Int("soak.members", 3, "members of the soak's etcd cluster (-soak.etcd); with 3 or more the soak kills leaders")
	soakNodeN     = flag.Int("soak.nodes", 10, "nodes of 8 GPUs the soak runs (the soak's pace is their GPUs': 6 nodes held 60-70 binds/s, 10 about 90, at 2 ms less CPU a bind)")
	soakLive      = flag.Int64("soak.live", 80, "live sessions (bound or queued) the users keep: about twice what the nodes hold at once, so that the nodes stay busy and the queue short")
	soakProcs     = flag.Int("soak.procs", 2, "nodes whose agents run as processes of their own, which chaos pauses (SIGSTOP, SIGCONT) and kills")
	soakEvery     = flag.Duration("soak.every", 10*time.Second, "how often the soak logs its progress (-v)")
	soakCensus    = flag.Bool("soak.census", false, "log the live sessions by phase and reason every 10 s (-v)")
	soakMix       = flag.Bool("soak.mix", false, "count the revisions by the directories they wrote and report them a bind (one more watch of everything)")
	soakGOGC      = flag.Int("soak.gogc", 400, "the Go collector's target (GOGC) of the soak's process and its etcd members; 0: Go's default")
	soakEtcdArgs  = flag.String("soak.etcdargs", "", "more flags for each etcd member, separated by spaces (e.g. --enable-pprof)")
	soakCalls     = flag.Bool("soak.calls", false, "count the etcd requests by component and method and report them a bind")
	soakEtcdProcs = flag.Int("soak.etcdprocs", 1, "GOMAXPROCS of each etcd member; 0: Go's default (a P per core)")
	soakUnix      = flag.Bool("soak.unix", true, "the members serve their clients and each other on unix sockets, not loopback TCP (on one machine loopback TCP cost about a fifth of the soak's CPU a bind)")
	soakServer    = flag.String("soak.etcd", "debian", "the members' etcd: debian (Debian's etcd-server, or VOYAGER_TEST_ETCD), or module (etcd's own main at go.mod's version, run by this test binary; make soak's, never under the race detector)")
)

const (
	soakPlacers   = 3
	soakUsers     = 8
	soakAgentTTL  = 2 * time.Second
	soakPlacerTTL = 2 * time.Second
	// soakStuckAfter bounds, for the checker, how long a session may go
	// without progress or keep a part after it ended: far above what the
	// soak's timings need (a lease of 2 s, stops of 10 ms), far below its
	// length.
	soakStuckAfter = time.Minute
)

// soakProc is one running component that chaos can kill: its own etcd
// client, so that killing it cuts its connection and lets its lease expire.
type soakProc struct {
	cancel context.CancelFunc
	cli    *clientv3.Client
	done   chan struct{}
	proc   *agentProcess // an agent process (soakproc_test.go); the fields above are unset then
}

// leave stops it the orderly way: it returns from Run (a placer revokes
// its membership lease), then its connection closes.
func (p *soakProc) leave() {
	p.cancel()
	<-p.done
	_ = p.cli.Close()
}

func (p *soakProc) kill() {
	if p.proc != nil {
		p.proc.kill()
		return
	}
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

	// Debian's etcd in its own processes: under the race detector only
	// Voyager's code is instrumented, which makes the soak several times
	// cheaper than with the embedded server. Three members by default, so
	// that the soak can kill the leader.
	// The collector's target, in this process and in the etcd members:
	// at Go's default (100) collection took about a tenth of the soak's
	// CPU; the heaps here are far below the machine's memory.
	if *soakGOGC > 0 {
		old := debug.SetGCPercent(*soakGOGC)
		t.Cleanup(func() { debug.SetGCPercent(old) })
	}
	mopts := etcdtest.MembersOptions{GOGC: *soakGOGC, Args: strings.Fields(*soakEtcdArgs), Unix: *soakUnix}
	switch *soakServer {
	case "debian":
	case "module":
		// Debian's etcd (3.4) retries a lease keep-alive forwarded to a
		// dead leader in a tight loop until a new one is elected: about
		// 1.4 s of CPU a leader kill. The module's throttles it.
		mopts.Command, mopts.Env = os.Args[0], []string{envSoakEtcdMember + "=1"}
	default:
		t.Fatalf("-soak.etcd=%q: want debian or module", *soakServer)
	}
	if *soakEtcdProcs > 0 {
		// Three members and the test process share two cores: with a P
		// a core, each member's scheduler woke and parked threads
		// (futex) for work one thread does (about 8% of their CPU).
		mopts.Env = append(mopts.Env, fmt.Sprintf("GOMAXPROCS=%d", *soakEtcdProcs))
	}
	members := etcdtest.StartMembersWith(t, *soakEtcd, mopts)
	t.Logf("soak etcd: %s", etcdVersion(t, mopts.Command))
	k := state.MustKeys("/soak")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var calls callCounter
	dial := func(who string, endpoints []string, opts ...grpc.DialOption) *clientv3.Client {
		cfg := clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), DialOptions: opts}
		if *soakCalls {
			cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(calls.interceptor(who)))
		}
		cli, err := clientv3.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return cli
	}
	newClient := func(who string) *clientv3.Client { return dial(who, members.Endpoints) }
	// The users' and chaos's client.
	admin := newClient("users")
	t.Cleanup(func() { _ = admin.Close() })
	checkCli := newClient("checker")
	t.Cleanup(func() { _ = checkCli.Close() })
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
		res, err := history.Watch(checkCtx, checkCli, k, history.Options{
			Start:      r0.Header.Revision,
			StuckAfter: soakStuckAfter,
			OnRevision: func(rev, b int64) { checked.Store(rev); binds.Store(b) },
			OnViolation: func(v history.Violation) {
				vmu.Lock()
				violations = append(violations, v)
				n := len(violations)
				vmu.Unlock()
				if n <= 20 { // at once: a long soak's end may be hours away
					t.Logf("violation found: %s", v)
				}
			},
		})
		if err != nil {
			t.Errorf("checker: %v", err)
		}
		checkDone <- res
	}()
	var mix revisionMix
	if *soakMix {
		go mix.follow(checkCtx, admin, k, r0.Header.Revision+1)
	}
	// Compaction only behind the checker and the usage accountant (as
	// production compacts hours behind both): behind compaction the
	// accountant counts from the statuses, which do not show an attempt
	// that ended and was bound again within the history it missed.
	var accountant atomic.Pointer[lifecycle.Accountant]
	go func() {
		for ctx.Err() == nil {
			time.Sleep(2 * time.Second)
			rev := checked.Load()
			if a := accountant.Load(); a != nil && a.Applied() > 0 {
				rev = min(rev, a.Applied())
			} else {
				continue
			}
			if rev -= 1000; rev > r0.Header.Revision {
				_, _ = admin.Compact(ctx, rev)
			}
		}
	}()

	runOn := func(cli *clientv3.Client, f func(ctx context.Context, cli *clientv3.Client)) *soakProc {
		pctx, pcancel := context.WithCancel(ctx)
		p := &soakProc{cancel: pcancel, cli: cli, done: make(chan struct{})}
		go func() { defer close(p.done); f(pctx, cli) }()
		return p
	}
	run := func(who string, f func(ctx context.Context, cli *clientv3.Client)) *soakProc {
		return runOn(newClient(who), f)
	}
	var mu sync.Mutex
	// One runtime per node, kept across its agent's restarts: the
	// containers outlive the agent, as containerd's do (an agent process
	// has a runtime of its own).
	fakes := make([]*runtime.Fake, *soakNodeN)
	for i := range fakes {
		fakes[i] = soakRuntime()
	}
	// The agents' homes and logs (a log and a topology file a container)
	// on tmpfs where there is one: creating files on this machine's disk
	// took a fifth of the soak's CPU.
	scratch := t.TempDir()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", fmt.Sprintf("voyager-soak-%d-", os.Getpid())); err == nil {
			scratch = d
			t.Cleanup(func() { _ = os.RemoveAll(d) })
		}
	}
	// Each in-process agent dials etcd through a link of its node's, which
	// chaos cuts: an etcd outage of that node alone, from every member
	// (an agent process has a link of its own, cut by signals).
	links := make([]*etcdtest.Link, *soakNodeN)
	for i := range links {
		links[i] = etcdtest.NewLink()
	}
	// Node i's GPU 0 is split into MIG devices or whole, as split[i]
	// says; an agent that comes back after a kill comes back with the
	// other split (an operator changed the MIG mode meanwhile).
	split := make([]bool, *soakNodeN)
	split[0] = true
	var aprocs agentProcs
	// The last -soak.procs nodes' agents are processes of their own.
	isProc := func(i int) bool { return i >= *soakNodeN-*soakProcs }
	agent := func(i int) *soakProc {
		name := fmt.Sprintf("n%02d", i)
		mu.Lock()
		mig := split[i]
		mu.Unlock()
		dir := filepath.Join(scratch, fmt.Sprintf("%s-%d", name, time.Now().UnixNano()))
		if isProc(i) {
			p, err := aprocs.start(i, name, mig, members.Endpoints, dir, *soakGOGC)
			if err != nil {
				t.Error(err)
				return nil
			}
			return &soakProc{proc: p}
		}
		return runOn(dial("agent", members.Endpoints, links[i].DialOption()), func(ctx context.Context, cli *clientv3.Client) {
			_ = nodeagent.New(soakAgentConfig(i, name, mig, cli, fakes[i], dir)).Run(ctx)
		})
	}
	placerProc := func() *soakProc {
		return run("placer", func(ctx context.Context, cli *clientv3.Client) {
			// A placer process runs the status merger beside the placer.
			p := placer.New(cli, placer.Config{Keys: k, LeaseTTL: soakPlacerTTL, Logger: quiet, Tick: 200 * time.Millisecond})
			m := merger.New(cli, merger.Config{Keys: k, Logger: quiet, Member: p.ID()})
			merged := make(chan struct{})
			go func() { defer close(merged); _ = m.Run(ctx) }()
			_ = p.Run(ctx)
			<-merged
		})
	}
	agents := make([]*soakProc, *soakNodeN)
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
	ret := run("retention", func(ctx context.Context, cli *clientv3.Client) {
		r, err := lifecycle.NewRetention(cli, lifecycle.RetentionConfig{Keys: k, After: 2 * time.Second, Every: time.Second,
			HistoryPath: retDir + "/history.jsonl", Logger: quiet})
		if err != nil {
			t.Error(err)
			return
		}
		_ = r.Run(ctx)
	})
	sw := run("sweep", func(ctx context.Context, cli *clientv3.Client) {
		_ = sweep.New(cli, sweep.Config{Keys: k, Logger: quiet, Every: time.Second}).Run(ctx)
	})
	// Quotas: u0 may hold 10 GPUs; chaos changes u1's.
	ten := int64(10)
	if _, err := state.Put(ctx, admin, k.UserQuota("u0"), state.Quota{GPUs: &ten}); err != nil {
		t.Fatal(err)
	}
	lc := run("lifecycle", func(ctx context.Context, cli *clientv3.Client) {
		ctl := lifecycle.NewController(cli, lifecycle.ControllerConfig{Keys: k, Logger: quiet, Every: 100 * time.Millisecond,
			StopWarning: 50 * time.Millisecond, PreemptGrace: 50 * time.Millisecond, MaxRuntime: time.Hour})
		_ = ctl.Run(ctx)
	})
	// The usage accountant: every ended attempt's GPU-hours, which the
	// checker's accrual rules hold to once each. It deletes the accruals
	// of retired sessions when elected and every 10 s after (production:
	// hourly), as retention retires sessions every second, so etcd holds
	// about 10 s of them.
	acct := run("accountant", func(ctx context.Context, cli *clientv3.Client) {
		a := lifecycle.NewAccountant(cli, lifecycle.AccountantConfig{Keys: k, Logger: quiet, CursorEvery: time.Second,
			SweepEvery: 10 * time.Second})
		accountant.Store(a)
		_ = a.Run(ctx)
	})

	// Users: keep -soak.live sessions live; stop some at random.
	var submitted atomic.Int64
	// Live sessions (bindings and queue entries), counted every 50 ms
	// for all users, from whichever member answers (serializable: the
	// users' pace needs no leader's round).
	var liveN atomic.Int64
	liveN.Store(*soakLive)
	go func() {
		for ctx.Err() == nil {
			r, err := admin.Txn(ctx).Then(clientv3.OpGet(k.AllBindings(), clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithSerializable()),
				clientv3.OpGet(k.PendingDir(), clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithSerializable())).Commit()
			if err == nil {
				liveN.Store(r.Responses[0].GetResponseRange().Count + r.Responses[1].GetResponseRange().Count)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	// The sessions waiting to run again (a back-off, a fence, a
	// preemption: Pending with a retry time, neither bound nor queued)
	// are live too, and the queue entries of u0 and u1, the owners with
	// quotas, each of which may have at most -soak.live/10 waiting
	// (soakOwner): counted every half second. Without the first, the
	// users replaced each session waiting to restart with a new one, and
	// a lifecycle controller behind its re-queues (thousands waited past
	// their retry time) had the users add ever more.
	var restarting, waitingU0, waitingU1 atomic.Int64
	live := func() int64 { return liveN.Load() + restarting.Load() }
	go func() {
		for ctx.Err() == nil {
			r, err := admin.Txn(ctx).Then(clientv3.OpGet(k.PendingDir(), clientv3.WithPrefix(), clientv3.WithSerializable()),
				clientv3.OpGet(k.StatusDir(), clientv3.WithPrefix(), clientv3.WithSerializable())).Commit()
			if err == nil {
				var n0, n1, again int64
				for _, kv := range r.Responses[0].GetResponseRange().Kvs {
					if q, err := state.Decode[state.QueueEntry](kv.Value); err == nil {
						switch q.Owner {
						case "u0":
							n0++
						case "u1":
							n1++
						}
					}
				}
				for _, kv := range r.Responses[1].GetResponseRange().Kvs {
					if st, err := state.Decode[state.Status](kv.Value); err == nil && st.Phase == state.PhasePending && st.RetryAt != nil {
						again++
					}
				}
				waitingU0.Store(n0)
				waitingU1.Store(n1)
				restarting.Store(again)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}()
	maxWaiting := max(*soakLive/10, 4)
	owner := func() string {
		o := soakOwner(rnd(100))
		if (o == "u0" && waitingU0.Load() >= maxWaiting) || (o == "u1" && waitingU1.Load() >= maxWaiting) {
			o = fmt.Sprintf("u%d", 2+rnd(3))
		}
		return o
	}
	// A user's create that meets a leader's death (unavailable, timed out)
	// is tried again, as the CLI does with its idempotency key: a create
	// that had committed says the id exists.
	retried := func(create func() error) error {
		for i := 0; ; i++ {
			err := create()
			if i > 0 && errors.Is(err, state.ErrExists) {
				return nil
			}
			if err == nil || ctx.Err() != nil || i == 50 || !transient(err) {
				return err
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	var wg sync.WaitGroup
	// Several users at once: one etcd round trip at a time would pace
	// the soak by its latency, not by what the components can do.
	for user := 0; user < soakUsers; user++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for binds.Load() < *soakBinds && ctx.Err() == nil {
				if live() >= *soakLive {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				for j := 0; j < 5; j++ {
					n := submitted.Add(1)
					s := state.Session{ID: fmt.Sprintf("s%07d", n), Owner: owner(), Kind: state.KindBatch,
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
					case roll < 48: // a multi-node job: every part exits, or all run to their max runtime
						s.Nodes = 2 + rnd(2)
						if rnd(2) == 0 {
							delete(s.Env, "SOAK_EXIT")
							s.Limits.MaxRuntime = state.Duration(time.Duration(200+rnd(800)) * time.Millisecond)
						}
					case roll < 51: // a MIG device, on a node whose GPU 0 is split now
						s.Resources.GPUs, s.Resources.MIGProfile = 1, "3g.40gb"
					case roll < 52: // a job array under a cap
						a := state.Array{ID: fmt.Sprintf("a%07d", n), Owner: s.Owner, Indices: "0-7", MaxRunning: 3, Created: time.Now().UTC(),
							Template: state.Session{Owner: s.Owner, Kind: state.KindBatch, Desired: state.DesiredRunning, Image: "busybox",
								Command: []string{"job", "{index}"}, Resources: state.Resources{GPUs: 1, CPUMilli: 500, MemoryMiB: 1024},
								Env: map[string]string{"SOAK_EXIT": "0"}}}
						if err := retried(func() error { return state.CreateArray(ctx, admin, k, a) }); err != nil && ctx.Err() == nil {
							t.Errorf("create array %s: %v", a.ID, err)
						}
						continue
					}
					if err := retried(func() error { _, err := state.CreateSession(ctx, admin, k, s, time.Now()); return err }); err != nil && ctx.Err() == nil {
						t.Errorf("create %s: %v", s.ID, err)
					}
				}
			}
		}()
	}
	// Chaos.
	busy := make([]bool, *soakNodeN) // an agent killed or cut off: one fault at a time per node
	var outages, cordons, leaderKills, leaderMissed, pauses atomic.Int64
	var leaderDown atomic.Bool
	wg.Add(1)
	go func() {
		defer wg.Done()
		for *soakChaos && binds.Load() < *soakBinds && ctx.Err() == nil {
			time.Sleep(time.Duration(5+rnd(20)) * time.Millisecond)
			switch roll := rnd(10000); {
			case roll < 3000: // a user stops a random recent session
				if n := submitted.Load(); n > 0 {
					id := fmt.Sprintf("s%07d", n-int64(rnd(int(min(n, 200)))))
					_, _ = state.StopSession(ctx, admin, k, id, "soak", time.Now())
				}
			case roll < 3060: // a placer leaves or is killed; another joins
				mu.Lock()
				i := rnd(len(placers))
				if rnd(2) == 0 {
					placers[i].leave()
				} else {
					placers[i].kill()
				}
				placers[i] = placerProc()
				mu.Unlock()
			case roll < 3100: // an agent is killed: its lease expires, later it comes back, its GPU 0 split otherwise
				i := rnd(*soakNodeN)
				mu.Lock()
				a := agents[i]
				if a == nil || busy[i] {
					mu.Unlock()
					continue
				}
				busy[i], agents[i] = true, nil
				split[i] = !split[i]
				mu.Unlock()
				a.kill()
				wg.Add(1)
				go func() {
					defer wg.Done()
					time.Sleep(soakAgentTTL + time.Duration(rnd(2000))*time.Millisecond)
					mu.Lock()
					busy[i] = false
					mu.Unlock()
					if ctx.Err() == nil {
						p := agent(i)
						mu.Lock()
						agents[i] = p
						mu.Unlock()
					}
				}()
			case roll < 3160: // a node's etcd outage: longer than its fence deadline, shorter than its lease (3130), or past the lease, as a paused agent's
				i := rnd(*soakNodeN)
				mu.Lock()
				if busy[i] || agents[i] == nil {
					mu.Unlock()
					continue
				}
				busy[i] = true
				link := links[i].Cut // an in-process agent's, or the process's own
				unlink := links[i].Restore
				if a := agents[i]; a != nil && a.proc != nil {
					link, unlink = a.proc.cut, a.proc.restore
				}
				mu.Unlock()
				out := soakAgentTTL/2 + soakAgentTTL/10 + time.Duration(rnd(int(soakAgentTTL*3/10/time.Millisecond)))*time.Millisecond
				if roll >= 3130 {
					out = soakAgentTTL + time.Duration(500+rnd(1000))*time.Millisecond
				}
				outages.Add(1)
				wg.Add(1)
				go func() {
					defer wg.Done()
					link()
					time.Sleep(out)
					unlink()
					mu.Lock()
					busy[i] = false
					mu.Unlock()
				}()
			case roll < 3190: // a node cordoned, or drained with a short deadline, and uncordoned a little later
				name := fmt.Sprintf("n%02d", rnd(*soakNodeN))
				now := time.Now().UTC()
				cd := state.Cordon{Node: name, Reason: "soak", By: "soak", Since: now}
				if rnd(2) == 0 {
					at := now.Add(200 * time.Millisecond)
					cd.Drain, cd.Deadline = true, &at
				}
				if _, err := state.Put(ctx, admin, k.Cordon(name), cd); err == nil {
					cordons.Add(1)
					wg.Add(1)
					go func() {
						defer wg.Done()
						time.Sleep(time.Duration(500+rnd(1500)) * time.Millisecond)
						_, _ = admin.Delete(context.WithoutCancel(ctx), k.Cordon(name))
					}()
				}
			case roll < 3210: // u1's quota changes, or goes
				if rnd(3) == 0 {
					_, _ = admin.Delete(ctx, k.UserQuota("u1"))
				} else {
					g := int64(6 + rnd(10))
					_, _ = state.Put(ctx, admin, k.UserQuota("u1"), state.Quota{GPUs: &g})
				}
			case roll < 3215 && len(members.Endpoints) >= 3: // the etcd leader is killed, and comes back
				if !leaderDown.CompareAndSwap(false, true) {
					continue
				}
				l, err := members.Leader(ctx, admin)
				if err != nil {
					if leaderMissed.Add(1) <= 3 {
						t.Logf("chaos: no leader to kill: %v", err)
					}
					leaderDown.Store(false)
					continue
				}
				members.Kill(l)
				leaderKills.Add(1)
				wg.Add(1)
				go func() {
					defer wg.Done()
					time.Sleep(time.Duration(1000+rnd(2000)) * time.Millisecond)
					members.Restart(l)
					leaderDown.Store(false)
				}()
			case roll < 3245 && *soakProcs > 0: // an agent process paused (SIGSTOP) past its fence deadline, within its lease or past it, then let go on (SIGCONT)
				i := *soakNodeN - 1 - rnd(min(*soakProcs, *soakNodeN))
				mu.Lock()
				a := agents[i]
				if a == nil || a.proc == nil || busy[i] {
					mu.Unlock()
					continue
				}
				busy[i] = true
				mu.Unlock()
				out := soakAgentTTL/2 + soakAgentTTL/10 + time.Duration(rnd(int(soakAgentTTL*3/10/time.Millisecond)))*time.Millisecond
				if roll >= 3230 {
					out = soakAgentTTL + time.Duration(500+rnd(1000))*time.Millisecond
				}
				pauses.Add(1)
				wg.Add(1)
				go func() {
					defer wg.Done()
					a.proc.pause(out)
					mu.Lock()
					busy[i] = false
					mu.Unlock()
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
	// Progress every -soak.every: binds, their rate and CPU since the last
	// line and in all, violations so far, the machine's load.
	cpu0, err := readSoakCPU(members, &aprocs)
	if err != nil {
		t.Fatal(err)
	}
	load0 := loadAverage()
	lastCPU, lastBinds, lastAt := cpu0, int64(0), time.Now()
	for tick := 0; binds.Load() < *soakBinds && ctx.Err() == nil && !t.Failed(); tick++ {
		time.Sleep(time.Second)
		if testing.Verbose() && *soakCensus && tick%10 == 9 {
			t.Logf("live sessions by phase/reason: %s", census())
		}
		if time.Since(lastAt) < *soakEvery {
			continue
		}
		cpu, err := readSoakCPU(members, &aprocs)
		if err != nil {
			t.Fatal(err)
		}
		b := binds.Load()
		vmu.Lock()
		nv := len(violations)
		vmu.Unlock()
		held, statuses := soakHeld(ctx, admin, k)
		acc := "not started"
		if a := accountant.Load(); a != nil {
			acc = fmt.Sprintf("%d attempts counted, %d late, %d catch-ups, applied up to revision %d", a.Accrued(), a.Late(), a.CatchUps(), a.Applied())
		}
		t.Logf("%s: %d binds (%.0f/s; CPU %s a bind since the last line, %s in all), %d submitted, checked up to revision %d, %d violations; etcd holds %s; accountant: %s; load %s",
			time.Since(began).Round(time.Second), b, float64(b-lastBinds)/time.Since(lastAt).Seconds(), cpu.sub(lastCPU).perBind(b-lastBinds),
			cpu.sub(cpu0).perBind(b), submitted.Load(), checked.Load(), nv, held, acc, loadAverage())
		if statuses > 20*int(*soakLive) && testing.Verbose() {
			// Finished sessions pile up: retention or the accountant
			// behind, or sessions stuck. Say which phases hold them.
			t.Logf("etcd holds %d statuses for %d live sessions: %s", statuses, *soakLive, census())
		}
		lastCPU, lastBinds, lastAt = cpu, b, time.Now()
	}
	wg.Wait()
	stopping := time.Now()
	t.Logf("soak: users and chaos stopped at %s; stopping every live session", stopping.Sub(began).Round(time.Second))
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
	if len(stuck) == 0 {
		t.Logf("soak: every live session ended within %s of the stops", time.Since(stopping).Round(100*time.Millisecond))
	}
	mu.Lock()
	for _, p := range append(append([]*soakProc{lc, ret, sw}, placers...), agents...) {
		if p != nil {
			p.kill()
		}
	}
	mu.Unlock()
	// The accountant records the last ends a Gather after they came:
	// it stops once it has counted every bind the checker saw (nothing
	// binds now), or after a bound, and what it missed shows below.
	readTo := func(key string) {
		r, err := admin.Put(ctx, k.Profile(key), "{}")
		if err != nil {
			t.Fatal(err)
		}
		for checked.Load() < r.Header.Revision && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
		}
	}
	readTo("soak-binds")
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if n, _ := soakAccrued(ctx, admin, k); n >= binds.Load() {
			break
		}
	}
	acct.kill()
	// Read the history to its end.
	readTo("soak-end")
	stopCheck()
	res := <-checkDone
	elapsed := time.Since(began)
	cpu, err := readSoakCPU(members, &aprocs)
	if err != nil {
		t.Fatal(err)
	}
	used := cpu.sub(cpu0)
	t.Logf("soak: %d binds, %d sessions, %d revisions checked (%.1f a bind), %d violations; wall %s, %.0f binds/s; CPU %s (%s test process, %s agent processes, %s etcd), %s a bind; load %s at the start, %s at the end; %d etcd leaders killed, %d node etcd outages, %d agent processes paused, %d cordons",
		res.Binds, submitted.Load(), res.Revisions, float64(res.Revisions)/float64(max(res.Binds, 1)), res.Count,
		elapsed.Round(time.Second), float64(res.Binds)/elapsed.Seconds(),
		used.total().Round(time.Second), used.self.Round(time.Second), used.agents.Round(time.Second), used.etcd.Round(time.Second), used.perBind(res.Binds),
		load0, loadAverage(), leaderKills.Load(), outages.Load(), pauses.Load(), cordons.Load())
	t.Logf("soak: the etcd members' processes now have used %v (a member killed and started again counts from its restart); leader changes each live member saw since its start: %v",
		roundAll(cpu.members), leaderChanges(members.Endpoints))
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
	attempts, err := soakAccrued(context.Background(), admin, k)
	if err != nil {
		t.Fatal(err)
	}
	// Attempts still bound at the end have not ended: not counted yet.
	bound := 0
	if sts, err := admin.Get(context.Background(), k.StatusDir(), clientv3.WithPrefix()); err == nil {
		for _, kv := range sts.Kvs {
			if st, err := state.Decode[state.Status](kv.Value); err == nil && state.BoundPhase(st.Phase) {
				bound++
			}
		}
	}
	t.Logf("soak: the usage accountant counted %d attempt-days of %d binds (%d attempts still bound at the end; an attempt over midnight counts in two days)",
		attempts, res.Binds, bound)
	if *soakMix {
		t.Logf("soak: %s", mix.report(res.Binds, 25))
	}
	if *soakCalls {
		t.Logf("soak: %s", calls.report(res.Binds))
	}
	if attempts == 0 {
		t.Error("the usage accountant counted no attempt")
	}
}

// soakAccrued is the attempts the usage accountant has counted, by the
// GPU-hours of every day (an attempt over midnight counts in two).
func soakAccrued(ctx context.Context, cli *clientv3.Client, k state.Keys) (int64, error) {
	days, err := cli.Get(ctx, k.GPUHoursDir(), clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("read GPU-hours: %w", err)
	}
	var n int64
	for _, kv := range days.Kvs {
		if d, err := state.Decode[state.UsageDay](kv.Value); err == nil {
			n += int64(d.Attempts)
		}
	}
	return n, nil
}

// soakOwner is the owner of a session whose roll (0-99) is given: u0
// (a quota of 10 GPUs) and u1 (whose quota chaos changes, or deletes) a
// tenth of the time each, u2-u4 the rest. The users keep a number of
// sessions live, not of sessions that can run, so an owner whose queue
// outgrows its quota's pace would fill the live sessions with requests
// that wait on it and leave the nodes idle: with every owner alike, at
// 90 binds/s, u0's and u1's did; with a tenth each, u0's still did within
// 20 minutes at 200 binds/s (200 of 240 live sessions waiting on its 10
// GPUs, 43 of 192 GPUs held, the soak's pace ten times u0's). So a
// session rolled for u0 or u1 goes to u2-u4 while that owner already has
// -soak.live/10 requests waiting.
func soakOwner(roll int) string {
	switch {
	case roll < 10:
		return "u0"
	case roll < 20:
		return "u1"
	}
	return fmt.Sprintf("u%d", 2+roll%3)
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(100 * time.Millisecond)
	}
	return out
}

// transient reports whether err is an etcd error that a leader's death
// causes and that a retry outlives.
func transient(err error) bool {
	if errors.Is(err, rpctypes.ErrTimeout) || errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail) || errors.Is(err, rpctypes.ErrNoLeader) ||
		errors.Is(err, rpctypes.ErrTimeoutDueToConnectionLost) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	// gRPC's own (a connection reset as the member died) wrapped in ours.
	return strings.Contains(err.Error(), "code = Unavailable") || strings.Contains(err.Error(), "code = DeadlineExceeded") ||
		strings.Contains(err.Error(), "request timed out")
}

// etcdVersion is what etcd (command, or Debian's when empty) says its
// version is.
func etcdVersion(t *testing.T, command string) string {
	cmd := exec.Command("etcd", "--version")
	if command != "" {
		cmd = exec.Command(command, "--version")
		cmd.Env = append(os.Environ(), envSoakEtcdMember+"=1")
	} else if bin := os.Getenv("VOYAGER_TEST_ETCD"); bin != "" {
		cmd = exec.Command(bin, "--version")
	}
	out, err := cmd.Output()
	if err != nil {
		return fmt.Sprintf("unknown (%v)", err)
	}
	return strings.Join(strings.Fields(strings.ReplaceAll(string(out), "\n", "; ")), " ")
}

// leaderChanges is etcd_server_leader_changes_seen_total of each member
// (from its /metrics), or -1 where it does not answer: a member that saw
// more changes than the soak killed leaders lost its leader otherwise
// (missed heartbeats under load).
func leaderChanges(endpoints []string) []int {
	out := make([]int, len(endpoints))
	for i, ep := range endpoints {
		out[i] = -1
		hc, url := memberHTTP(ep)
		resp, err := hc.Get(url + "/metrics")
		if err != nil {
			continue
		}
		b, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "etcd_server_leader_changes_seen_total "); ok {
				if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
					out[i] = int(f)
				}
			}
		}
	}
	return out
}

// memberHTTP is an HTTP client of the member at endpoint ep and the URL
// of its root: ep's own for a TCP endpoint (http://host:port), a client
// that dials the socket for a unix one (unix:///path).
func memberHTTP(ep string) (*http.Client, string) {
	path, ok := etcdtest.SocketPath(ep)
	if !ok {
		return &http.Client{Timeout: 2 * time.Second}, ep
	}
	var d net.Dialer
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return d.DialContext(ctx, "unix", path) }}
	return &http.Client{Timeout: 2 * time.Second, Transport: tr}, "http://member"
}

// soakHeld says how many statuses, accruals and secrets records etcd
// holds, and returns the statuses' count too: with retention and the
// accountant's sweep keeping up, about the live sessions and a few
// seconds of ended ones, however long the soak has run.
func soakHeld(ctx context.Context, cli *clientv3.Client, k state.Keys) (string, int) {
	r, err := cli.Txn(ctx).Then(
		clientv3.OpGet(k.StatusDir(), clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithSerializable()),
		clientv3.OpGet(k.Accruals(), clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithSerializable()),
		clientv3.OpGet(k.SpecSecretsDir(), clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithSerializable())).Commit()
	if err != nil {
		return "(unread: " + err.Error() + ")", 0
	}
	n := int(r.Responses[0].GetResponseRange().Count)
	return fmt.Sprintf("%d statuses, %d accruals, %d secrets records", n,
		r.Responses[1].GetResponseRange().Count, r.Responses[2].GetResponseRange().Count), n
}
