package placer

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gojson "github.com/goccy/go-json"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/benchsum"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/internal/scalebench"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// benchSizes draws session sizes: 40% 1 GPU, 30% 2, 20% 4, 10% 8.
func benchSizes(rng *rand.Rand, n int) []int {
	out := make([]int, n)
	for i := range out {
		switch x := rng.Intn(10); {
		case x < 4:
			out[i] = 1
		case x < 7:
			out[i] = 2
		case x < 9:
			out[i] = 4
		default:
			out[i] = 8
		}
	}
	return out
}

// benchCluster is a fresh embedded etcd with fsync on and nodes simulated
// 8-GPU nodes. It returns the etcd's endpoint.
func benchCluster(b *testing.B, nodes int) (string, *clientv3.Client, *sim) {
	c := etcdtest.Start(b, etcdtest.Options{Fsync: true})
	cli := c.Client(b)
	return c.Server.Endpoint(), cli, benchNodes(b, cli, nodes)
}

// benchClusterOwnCore is benchCluster on Debian's etcd in a process of its
// own, run on CPU 0 alone, while this process (the placers, the replays,
// the benchmark's watch) is moved to the other CPUs until the benchmark
// ends: each side has cores of its own, as etcd and the placers have
// machines of their own in a deployment. It needs two CPUs.
func benchClusterOwnCore(b *testing.B, nodes int) (string, *clientv3.Client, *sim, func() (time.Duration, error)) {
	e := etcdtest.StartOwnCore(b)
	cli := e.Client(b)
	return e.Endpoint, cli, benchNodes(b, cli, nodes), e.CPU
}

// cpuTrace samples a process's CPU time every cpuTraceEvery, so that the
// share of a core it used in a window can be read once the window is over
// (its end is known only then).
type cpuTrace struct {
	sample func()
	mu     sync.Mutex
	at     []time.Time
	cpu    []time.Duration
}

const cpuTraceEvery = 5 * time.Millisecond

// traceCPU samples read until ctx ends.
func traceCPU(ctx context.Context, b *testing.B, read func() (time.Duration, error)) *cpuTrace {
	c := &cpuTrace{}
	c.sample = func() {
		cpu, err := read()
		if err != nil {
			b.Errorf("sample CPU: %v", err)
			return
		}
		c.mu.Lock()
		c.at, c.cpu = append(c.at, time.Now()), append(c.cpu, cpu)
		c.mu.Unlock()
	}
	c.sample()
	go func() {
		t := time.NewTicker(cpuTraceEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				c.sample()
			}
		}
	}()
	return c
}

// busy is the share of one core the process used from the last sample at
// or before from to the first at or after to (a window a sample interval
// wider at most). Called once the window is over, it samples now when no
// sample is that late yet.
func (c *cpuTrace) busy(b *testing.B, from, to time.Time) float64 {
	c.mu.Lock()
	late := len(c.at) > 0 && !c.at[len(c.at)-1].Before(to)
	c.mu.Unlock()
	if !late {
		c.sample()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	i := sort.Search(len(c.at), func(i int) bool { return c.at[i].After(from) }) - 1
	j := sort.Search(len(c.at), func(i int) bool { return !c.at[i].Before(to) })
	if i < 0 || j >= len(c.at) {
		b.Fatalf("no CPU samples around the window %s-%s", from.Format(time.StampMicro), to.Format(time.StampMicro))
	}
	return float64(c.cpu[j]-c.cpu[i]) / float64(c.at[j].Sub(c.at[i]))
}

// benchNodes registers nodes simulated 8-GPU nodes on cli.
func benchNodes(b *testing.B, cli *clientv3.Client, nodes int) *sim {
	s := newSim(b, cli)
	ctx := context.Background()
	lease, err := cli.Grant(ctx, 3600)
	if err != nil {
		b.Fatal(err)
	}
	var ops []clientv3.Op
	for i := 0; i < nodes; i++ {
		n := gpuNode(fmt.Sprintf("sim%04d", i), 8, "NVIDIA A100-SXM4-80GB (simulated)")
		n.Simulated = true
		v, _ := state.Encode(n)
		ops = append(ops, clientv3.OpPut(s.k.Node(n.Name), v, clientv3.WithLease(lease.ID)))
		if len(ops) == 100 || i == nodes-1 {
			if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
				b.Fatal(err)
			}
			ops = ops[:0]
		}
	}
	return s
}

// submitAll creates sessions with workers in parallel, as many API
// replicas would; it records each session's commit time in at.
func submitAll(b *testing.B, ctx context.Context, s *sim, sizes []int, workers int, at *sync.Map) {
	var wg sync.WaitGroup
	ch := make(chan int)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ch {
				ids := s.submit(ctx, fmt.Sprintf("user%d", i%7), []int{sizes[i]}, nil)
				if at != nil {
					at.Store(ids[0], time.Now())
				}
			}
		}()
	}
	for i := range sizes {
		ch <- i
	}
	close(ch)
	wg.Wait()
}

// boundWatch records when each session's first binding appears.
func boundWatch(b *testing.B, ctx context.Context, cli *clientv3.Client, k state.Keys, onBound func(b state.Binding, createRev int64)) *watcher.Cache[state.Binding] {
	cache := watcher.New(cli, k.AllBindings(), watcher.JSON[state.Binding], watcher.Options{Name: "bench", Logger: quietLogger(), PageSize: 5000})
	cache.AddHandler(func(ev watcher.Event[state.Binding]) {
		if ev.Type == watcher.Added && ev.Value.Role != state.RoleWorker {
			onBound(ev.Value, ev.Revision) // a binding is created, never modified
		}
	})
	go func() { _ = cache.Run(ctx) }()
	if err := cache.WaitSynced(ctx); err != nil {
		b.Fatal(err)
	}
	return cache
}

// countBindings calls onBound for each head binding created under k from
// now on (a Ray worker's binding is its gang's, not a session's). It is
// boundWatch without the cache: a bare watch whose events are read for
// their role alone, since the burst's windows share cores with the
// placers they measure. A cache of every binding, each decoded whole,
// cost a fifth of the benchmark process's CPU in a burst (10 µs per
// binding), taken from the placers placing and from the replaying client.
func countBindings(b *testing.B, ctx context.Context, cli *clientv3.Client, k state.Keys, onBound func()) {
	now, err := cli.Get(ctx, k.AllBindings(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		b.Fatal(err)
	}
	wch := cli.Watch(clientv3.WithRequireLeader(ctx), k.AllBindings(), clientv3.WithPrefix(), clientv3.WithRev(now.Header.Revision+1))
	go func() {
		for resp := range wch {
			if err := resp.Err(); err != nil {
				if ctx.Err() == nil {
					b.Errorf("watch bindings: %v", err)
				}
				return
			}
			for _, ev := range resp.Events {
				if ev.Type != clientv3.EventTypePut || ev.Kv.Version != 1 {
					continue // a binding is created, never modified
				}
				var bd struct {
					Role state.Role `json:"role"`
				}
				if err := gojson.Unmarshal(ev.Kv.Value, &bd); err != nil {
					b.Errorf("decode binding %s: %v", ev.Kv.Key, err)
					return
				}
				if bd.Role != state.RoleWorker {
					onBound()
				}
			}
		}
	}()
}

func startPlacers(b *testing.B, endpoint string, n int, cfg Config) []*Placer {
	var ps []*Placer
	for i := 0; i < n; i++ {
		p, _, _ := runPlacer(b, endpoint, cfg)
		ps = append(ps, p)
	}
	return ps
}

func sumStats(ps []*Placer) Stats {
	var s Stats
	for _, p := range ps {
		st := p.Stats()
		s.Bound += st.Bound
		s.Conflicts += st.Conflicts
		s.Txns += st.Txns
		s.Passes += st.Passes
		s.Statuses += st.Statuses
	}
	return s
}

// fragmentation reports nodes with some but not all GPUs free, and how
// many more 8-GPU sessions would fit (nodes with all 8 free).
func fragmentation(w world, nodes int) (partial, whole int) {
	used := map[string]int{}
	for name, l := range w.ledgers {
		used[name] = len(l.GPUOwners())
	}
	for i := 0; i < nodes; i++ {
		u := used[fmt.Sprintf("sim%04d", i)]
		switch {
		case u == 0:
			whole++
		case u < 8:
			partial++
		}
	}
	return partial, whole
}

// BenchmarkPlacementBurst: 20,000 sessions are queued, then placers start
// on 1,000 × 8 GPUs and bind until nothing more fits. It reports the
// binding rate, conflicts per binding, and the ceiling: the bind
// transactions the placers committed, committed again on the same etcd with
// no planning and as many in flight (ceilingReplay), the median of
// ceilingReplays replays. The etcd=in-process cases run an embedded etcd in
// this process; the etcd=own-core cases Debian's etcd in a process of its
// own on a core of its own (benchClusterOwnCore), and report how busy
// placement and the ceiling kept that core.
func BenchmarkPlacementBurst(b *testing.B) {
	// The placers run with the collector deploy/systemd/placer.env sets,
	// and so, in this process, do the embedded etcd and the ceiling's
	// replays: one setting for both sides of the ratio.
	gogc, err := strconv.Atoi(scalebench.DeployedGOGC(b, "placer"))
	if err != nil {
		b.Fatalf("placer.env's GOGC: %v", err)
	}
	defer debug.SetGCPercent(debug.SetGCPercent(gogc))
	// A process's first burst ran about 1.5x slower than the next ones
	// (three placers: 0.26 of the ceiling in the first of five runs in a
	// process, 0.36-0.47 in the others; 200 µs of CPU per binding against
	// 126-144), while the ceiling's replays always run after a placement:
	// fresh heap pages, pools, etcd's first writes. A placer is a
	// long-running process: one burst, not measured, warms this one first.
	b.Run("warm-up", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			benchBurst(b, 1, Binpack, false, false)
		}
	})
	for _, tc := range []struct {
		placers  int
		strategy Strategy
		ownCore  bool
	}{{1, Binpack, false}, {3, Binpack, false}, {1, Spread, false}, {1, Binpack, true}, {3, Binpack, true}} {
		name := fmt.Sprintf("placers=%d/%s/etcd=in-process", tc.placers, tc.strategy)
		if tc.ownCore {
			name = fmt.Sprintf("placers=%d/%s/etcd=own-core", tc.placers, tc.strategy)
		}
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				benchBurst(b, tc.placers, tc.strategy, tc.ownCore, true)
			}
		})
	}
}

// burstProfile names the CPU profiles BenchmarkPlacementBurst writes of
// each measured window, from the gate to the last binding (name, then the
// case and a time).
var burstProfile = flag.String("burst.cpuprofile", "", "BenchmarkPlacementBurst: write a CPU profile of each measured window to this path plus the case's name")

// burstTrace names the execution traces BenchmarkPlacementBurst writes of
// each measured window, from the gate to a quiet second after the last
// binding: `go tool trace -pprof=sched` of one says which goroutines waited
// to run, and for how long.
var burstTrace = flag.String("burst.trace", "", "BenchmarkPlacementBurst: write an execution trace of each measured window to this path plus the case's name")

// windowFile creates the file of one window's profile or trace: prefix,
// then the case's name and a time. It is closed when b ends.
func windowFile(b *testing.B, prefix string) *os.File {
	f, err := os.Create(fmt.Sprintf("%s.%s.%d", prefix, strings.ReplaceAll(b.Name(), "/", "_"), time.Now().UnixNano()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = f.Close() })
	return f
}

// ceilingReplays is how many times a burst's transactions are replayed for
// its ceiling (the median counts).
const ceilingReplays = 3

// benchBurst runs one burst; with measure false it stops once the cluster
// is full, reporting nothing.
func benchBurst(b *testing.B, placers int, strategy Strategy, ownCore, measure bool) {
	const nodes, sessions = 1000, 20000
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		endpoint string
		cli      *clientv3.Client
		s        *sim
		etcd     *cpuTrace // etcd's process, when it has a core of its own
	)
	if ownCore {
		var etcdCPU func() (time.Duration, error)
		endpoint, cli, s, etcdCPU = benchClusterOwnCore(b, nodes)
		etcd = traceCPU(ctx, b, etcdCPU)
	} else {
		endpoint, cli, s = benchCluster(b, nodes)
	}
	rng := rand.New(rand.NewSource(42))
	submitAll(b, ctx, s, benchSizes(rng, sessions), 64, nil)
	before, err := cli.Get(ctx, "/before-placement")
	if err != nil {
		b.Fatal(err)
	}

	var mu sync.Mutex
	var first, last time.Time // the first and the newest binding seen
	bound := 0
	var counting atomic.Bool // set once placement starts
	var cpuAtLast time.Duration
	countBindings(b, ctx, cli, s.k, func() {
		cpu := time.Duration(0)
		if counting.Load() {
			cpu = benchsum.ProcessCPU(b)
		}
		mu.Lock()
		bound++
		last = time.Now()
		if bound == 1 {
			first = last
		}
		cpuAtLast = cpu
		mu.Unlock()
	})
	profiling := false
	rec := &txnRecorder{bindingDir: []byte(s.k.AllBindings())}
	gate := make(chan struct{})
	ps, stop := startRecordedPlacers(b, endpoint, placers, Config{Plan: PlanOptions{Strategy: strategy}, start: gate}, rec)
	for _, p := range ps {
		<-p.Ready()
	}
	// Measured from the moment every placer has its cache: the list of
	// 20,000 queue entries is start-up, not placement. The gate holds
	// each placer's first pass until all have synced (each syncs caches
	// of its own: without the gate the first to sync had bound 109-2,499
	// of the 3,027 sessions before the window opened), and every window
	// starts from a collected heap, as each replay of the ceiling does:
	// otherwise a window of 100-250 ms pays for the garbage of whatever
	// ran before it, or not, which moved one replay's rate 2x.
	runtime.GC()
	mu.Lock()
	early := bound
	mu.Unlock()
	if early != 0 {
		b.Fatalf("%d sessions were bound before the placers were let start", early)
	}
	// The profile and trace cover the window only: not the submission,
	// the sync or the ceiling's replays.
	if *burstProfile != "" && measure {
		f := windowFile(b, *burstProfile)
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
		defer pprof.StopCPUProfile() // if the window fails
		profiling = true
	}
	tracing := false
	if *burstTrace != "" && measure {
		f := windowFile(b, *burstTrace)
		if err := trace.Start(f); err != nil {
			b.Fatal(err)
		}
		defer trace.Stop() // if the window fails
		tracing = true
	}
	start := time.Now()
	close(gate)
	cpuStart := benchsum.ProcessCPU(b)
	counting.Store(true)
	var cpuUntilLast time.Duration // the process's CPU time at the newest binding
	var w world
	// The full check reads all of etcd and plans again: run it only once
	// bindings have stopped arriving for a second, so it does not steal
	// CPU from the placers it measures.
	eventuallyEvery(b, 5*time.Minute, 200*time.Millisecond, "the cluster to fill", func() bool {
		mu.Lock()
		quiet := bound > 0 && time.Since(last) > time.Second
		mu.Unlock()
		if !quiet {
			return false
		}
		if tracing {
			trace.Stop()
			tracing = false
		}
		if profiling {
			// It ends a quiet second after the last binding: what the
			// placers do after their binds (the waiting sessions'
			// statuses) is in it, the check below is not.
			pprof.StopCPUProfile()
			profiling = false
		}
		ok, ww := s.settled(ctx, PlanOptions{Strategy: strategy})
		w = ww
		return ok
	})
	mu.Lock()
	end := last
	elapsed := last.Sub(start)
	n := bound
	cpuUntilLast = cpuAtLast - cpuStart
	mu.Unlock()
	st := sumStats(ps)
	stop()
	if !measure {
		return
	}
	rate := float64(n) / elapsed.Seconds()

	txns := rec.sorted()
	workers := ceilingWorkers(rec)
	// The replay's watch does what placement's did for each binding. One
	// replay's rate moved 2× from run to run on these shared cores (etcd's
	// fsyncs, garbage collection): the ceiling is the median of
	// ceilingReplays, each under its own prefix.
	var replays []replayed
	for r := range ceilingReplays {
		rp := ceilingReplay(b, cli, txns, s.k.Prefix(), fmt.Sprintf("/ceiling%d", r), before.Header.Revision, workers)
		if rp.sessions != n {
			b.Fatalf("the recorded bind transactions bound %d sessions, the watch saw %d", rp.sessions, n)
		}
		replays = append(replays, rp)
	}
	slices.SortFunc(replays, func(x, y replayed) int { return cmp.Compare(x.rate, y.rate) })
	median := replays[len(replays)/2]
	ceiling := median.rate
	steadies := make([]float64, len(replays))
	for i, r := range replays {
		steadies[i] = r.steady
	}
	slices.Sort(steadies)
	steadyCeiling := steadies[len(steadies)/2]
	steady := steadyRate(n, first, end)
	rec.mu.Lock()
	firstSent, flight, trip := tripStats(rec.trips)
	rec.mu.Unlock()
	b.ReportMetric(rate, "bindings/s")
	// How soon the first session of the burst is bound: the pass's
	// snapshot, as much of its plan as comes before its first batch is
	// sent, and that batch's commit and delivery.
	b.ReportMetric(float64(first.Sub(start).Microseconds())/1000, "ms-to-first-binding")
	// Of that, how soon the first bind transaction is sent: the snapshot
	// and the plan up to its first batch.
	b.ReportMetric(float64(firstSent.Sub(start).Microseconds())/1000, "ms-to-first-txn")
	b.ReportMetric(ceiling, "ceiling-bindings/s")
	b.ReportMetric(rate/ceiling, "of-ceiling")
	// The same from each window's first binding to its last: placement's
	// rate once its first batch is bound, against the replay's once its
	// first is. The windows above differ by what comes before: the
	// placers' snapshot and first plan (ms-to-first-binding), against
	// one round trip.
	b.ReportMetric(steady/steadyCeiling, "of-ceiling-after-first-binding")
	b.ReportMetric(float64(n)/float64(len(txns)), "sessions/txn")
	b.ReportMetric(float64(st.Conflicts)/float64(max(st.Bound, 1)), "conflicts/binding")
	// How many transactions were in flight, and how long each took to
	// come back, placing and replaying: with as many in flight, a slower
	// rate is longer round trips (etcd's work, or the placers' gRPC and
	// watch goroutines waiting for the process's cores: -burst.trace
	// shows which).
	_, flightCeiling, tripCeiling := tripStats(median.trips)
	b.ReportMetric(flight, "txns-in-flight")
	b.ReportMetric(flightCeiling, "txns-in-flight-ceiling")
	b.ReportMetric(float64(trip.Microseconds())/1000, "txn-ms-p50")
	b.ReportMetric(float64(tripCeiling.Microseconds())/1000, "txn-ms-p50-ceiling")
	b.ReportMetric(float64(cpuUntilLast.Microseconds())/float64(n), "process-cpu-us/binding")
	b.ReportMetric(float64(median.cpu.Microseconds())/float64(n), "process-cpu-us/binding-ceiling")
	figure := fmt.Sprintf("placement burst, %d placer(s), %s, 1k nodes x 8 GPUs", placers, strategy)
	process, etcdBusy := "placers, etcd, this watch", ""
	if etcd != nil {
		// How busy placement kept etcd's core, beside how busy the
		// ceiling's median replay kept it: a ceiling short of a whole
		// core would be the replaying client's limit, not etcd's.
		placing, replaying := etcd.busy(b, start, end), etcd.busy(b, median.start, median.end)
		b.ReportMetric(placing, "etcd-core-busy")
		b.ReportMetric(replaying, "etcd-core-busy-ceiling")
		figure += ", etcd on a core of its own"
		process = "placers, this watch; not etcd"
		etcdBusy = fmt.Sprintf("; etcd's core busy %.2f of the window placing, %.2f replaying", placing, replaying)
	}
	benchsum.Add(b, benchsum.Row{Figure: figure,
		Value: rate, Unit: "bindings/s", Ceiling: ceiling, CeilingName: "same txns replayed, no planning"})
	gpus := 0
	for _, l := range w.ledgers {
		gpus += len(l.GPUOwners())
	}
	b.Logf("%s, %d placers: %d sessions (%d GPUs) bound in %s = %.0f/s; ceiling (the same %d txns, %.1f sessions each, %d in flight, replayed with no planning) %.0f/s: %.2f of it (from each window's first binding: %.0f/s against %.0f/s, %.2f); %d txns sent, %d conflicts; the process (%s) used %s of CPU until the last binding, %.0f µs per binding (the median replay %.0f)%s. Peers: Nomad C1M 3,750 allocs/s (5 servers), kube-scheduler scheduler_perf 680-810 pods/s",
		strategy, placers, n, gpus, elapsed.Round(time.Millisecond), rate, len(txns), float64(n)/float64(len(txns)), workers, ceiling, rate/ceiling, steady, steadyCeiling, steady/steadyCeiling, st.Txns, st.Conflicts, process, cpuUntilLast.Round(time.Millisecond), float64(cpuUntilLast.Microseconds())/float64(n), float64(median.cpu.Microseconds())/float64(n), etcdBusy)
}

// BenchmarkPlacementLatency offers sessions at 500/s for 20 s (10,000
// sessions) to 1,000 × 8 GPUs; agents finish each after 3 s, so the cluster
// stays below full and nothing queues (BenchmarkPlacementLatencySaturated
// is the full cluster). Each session's t0 is its intended start on the
// open-loop schedule. It reports pending→bound latency p50, p99 and p99.9.
func BenchmarkPlacementLatency(b *testing.B) { withPlacers(b, benchLatency) }

// withPlacers runs run b.N times as a sub-benchmark each with one placer
// and with three.
func withPlacers(b *testing.B, run func(b *testing.B, placers int)) {
	for _, placers := range []int{1, 3} {
		b.Run(fmt.Sprintf("placers=%d", placers), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				run(b, placers)
			}
		})
	}
}

func benchLatency(b *testing.B, placers int) {
	const nodes, rate, seconds = 1000, 500, 20
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	endpoint, cli, s := benchCluster(b, nodes)
	// Submission and binding times by session, recorded apart: a binding
	// may be seen before its submitter has recorded the submission.
	var at, boundAt sync.Map
	var bound atomic.Int64
	agentsCtx, stopAgents := context.WithCancel(ctx)
	defer stopAgents()
	var release sync.WaitGroup
	boundWatch(b, ctx, cli, s.k, func(bd state.Binding, rev int64) {
		if _, seen := boundAt.LoadOrStore(bd.Session, time.Now()); !seen {
			bound.Add(1)
		}
		release.Add(1)
		go func() {
			defer release.Done()
			select {
			case <-agentsCtx.Done():
				return
			case <-time.After(3 * time.Second):
			}
			_ = state.Release(agentsCtx, cli, s.k, bd.Node, bd.Session, rev, nil)
		}()
	})
	ps := startPlacers(b, endpoint, placers, Config{})
	rng := rand.New(rand.NewSource(7))
	sizes := benchSizes(rng, rate*seconds)
	// Open loop: session i is due at start + i/rate, whatever happened to
	// the previous ones, and its t0 is that due time: a submitter that
	// falls behind adds to the latency instead of hiding it.
	start := time.Now()
	var subs sync.WaitGroup
	for i, g := range sizes {
		due := start.Add(time.Duration(i) * time.Second / rate)
		time.Sleep(time.Until(due))
		subs.Add(1)
		go func() {
			defer subs.Done()
			ids := s.submit(ctx, fmt.Sprintf("user%d", g), []int{g}, nil)
			at.Store(ids[0], due)
		}()
	}
	subs.Wait()
	eventually(b, 2*time.Minute, "every offered session bound", func() bool { return bound.Load() >= int64(len(sizes)) })
	stopAgents()
	release.Wait()
	var lat []time.Duration
	at.Range(func(id, t0 any) bool {
		if t1, ok := boundAt.Load(id); ok {
			lat = append(lat, t1.(time.Time).Sub(t0.(time.Time)))
		}
		return true
	})
	st := sumStats(ps)
	p50, p99, p999 := reportLatency(b, lat, fmt.Sprintf("below full (nothing queues), %d placer(s), %d samples", placers, len(lat)))
	b.ReportMetric(float64(st.Conflicts)/float64(max(st.Bound, 1)), "conflicts/binding")
	b.Logf("%d placers, %d sessions offered at %d/s (open loop, t0 = intended start): pending→bound p50 %s p99 %s p99.9 %s; %d txns, %d conflicts",
		placers, len(sizes), rate, p50.Round(time.Millisecond), p99.Round(time.Millisecond), p999.Round(time.Millisecond), st.Txns, st.Conflicts)
}

// BenchmarkFragmentation fills half of 1,000 × 8 GPUs with 1-, 2- and
// 4-GPU sessions and reports what each strategy leaves for 8-GPU requests:
// nodes partly used, and whole nodes still free.
func BenchmarkFragmentation(b *testing.B) {
	for _, strategy := range []Strategy{Binpack, Spread} {
		b.Run(string(strategy), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				const nodes = 1000
				ctx, cancel := context.WithCancel(context.Background())
				endpoint, _, s := benchCluster(b, nodes)
				rng := rand.New(rand.NewSource(3))
				var sizes []int
				for total := 0; total < nodes*8/2; {
					g := []int{1, 2, 4}[rng.Intn(3)]
					sizes = append(sizes, g)
					total += g
				}
				submitAll(b, ctx, s, sizes, 64, nil)
				startPlacers(b, endpoint, 1, Config{Plan: PlanOptions{Strategy: strategy}})
				var w world
				eventuallyEvery(b, 5*time.Minute, 200*time.Millisecond, "every session bound", func() bool {
					w = s.read(ctx)
					return len(w.pending) == 0
				})
				partial, whole := fragmentation(w, nodes)
				b.ReportMetric(float64(partial), "partial-nodes")
				b.ReportMetric(float64(whole), "free-8gpu-slots")
				b.Logf("%s: %d sessions on half the GPUs leave %d nodes partly used and room for %d 8-GPU sessions", strategy, len(sizes), partial, whole)
				cancel()
			}
		})
	}
}

// BenchmarkNewPlan is the CPU cost of one pass, without etcd: a queue of
// mixed sessions planned over empty 8-GPU nodes (the first pass of a burst),
// and the same queue over the same nodes once the first plan's decisions
// fill them (every later pass while the queue waits: nothing fits, and each
// waiting session still needs its reason and position), without and with
// a PlanCache warm from the pass before (as a placer plans).
func BenchmarkNewPlan(b *testing.B) {
	for _, tc := range []struct{ nodes, queued int }{{1000, 20000}, {10000, 100000}} {
		empty := newPlanBenchSnapshot(tc.nodes, tc.queued)
		full := filledSnapshot(empty, NewPlan(empty, PlanOptions{ReserveAfter: time.Hour}))
		// The placer's case: a PlanCache warm from the pass before.
		cached := *full
		cached.Cache = NewPlanCache()
		NewPlan(&cached, PlanOptions{ReserveAfter: time.Hour})
		for _, c := range []struct {
			name string
			s    *Snapshot
		}{{"empty", empty}, {"full", full}, {"full-cached", &cached}} {
			b.Run(fmt.Sprintf("nodes=%d/queued=%d/%s", tc.nodes, tc.queued, c.name), func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					p := NewPlan(c.s, PlanOptions{ReserveAfter: time.Hour})
					if c.name == "empty" && len(p.Bound) == 0 {
						b.Fatal("nothing bound on empty nodes")
					}
					if len(p.Bound)+len(p.Waiting) != len(c.s.Pending) {
						b.Fatalf("%d bound and %d waiting of %d queued", len(p.Bound), len(p.Waiting), len(c.s.Pending))
					}
				}
			})
		}
	}
}

// newPlanBenchSnapshot is nodes empty 8-GPU nodes and queued sessions of
// mixed sizes from seven owners.
func newPlanBenchSnapshot(nodes, queued int) *Snapshot {
	rng := rand.New(rand.NewSource(1))
	s := &Snapshot{Now: t0}
	for i := 0; i < nodes; i++ {
		s.Nodes = append(s.Nodes, view(gpuNode(fmt.Sprintf("sim%05d", i), 8, "NVIDIA A100-SXM4-80GB")))
	}
	for i, g := range benchSizes(rng, queued) {
		p := req(fmt.Sprintf("s%06d", i), fmt.Sprintf("user%d", i%7), g, time.Duration(i)*time.Millisecond)
		p.Revision = int64(i + 1)
		s.Pending = append(s.Pending, p)
	}
	return s
}

// filledSnapshot is s after plan's decisions were bound: their allocations
// added to the ledgers they went to (each such ledger at a new revision),
// their sessions off the queue.
func filledSnapshot(s *Snapshot, plan *Plan) *Snapshot { return applyPart(s, plan.Bound, 0) }
