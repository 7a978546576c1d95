package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/benchsum"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/internal/scalebench"
	"github.com/voyager-gpu/voyager/state"
)

// The API scale run's parameters; `make bench-scale` sets them to the
// large site's, `make bench` runs the defaults.
var (
	scaleBin      = flag.String("scale.bin", "", "path of a built voyager binary for BenchmarkAPIScale's `voyager api` process; empty: the benchmark builds one")
	scaleNodes    = flag.Int("scale.nodes", 1000, "BenchmarkAPIScale: lease-backed 8-GPU nodes the load generator registers")
	scaleSessions = flag.Int("scale.sessions", 5000, "BenchmarkAPIScale: sessions queued before the API starts")
	scaleFill     = flag.Bool("scale.fill", true, "BenchmarkAPIScale: fill the nodes with a real `voyager placer` before the API starts, as a site with a queue is full; false leaves every node empty beside the queue (each queue plan then places a cluster's worth)")
)

// Samples of one API scale run: creates, and GETs of pending sessions sent
// while the creates run (at least as many).
const (
	scaleCreates  = 1000
	scaleCreators = 8
	scaleGetters  = 4
	// scaleUsers share the creates, so that none reaches the per-user
	// cap of queued sessions (VOYAGER_MAX_QUEUED_PER_USER, default 100).
	scaleUsers = 50
)

// BenchmarkAPIScale measures one real `voyager api` process at a site of
// scale.nodes lease-backed 8-GPU nodes with scale.sessions queued, on a
// real etcd with fsync. Unless -scale.fill=false, a real `voyager placer`
// first fills the nodes and stops (fillSite), so the API meets a site
// whose queue waits for room, as a site with a queue does. It reports
// creates per second with their p50 and p99, and GETs of pending sessions
// (whose queue position and reason come from the queue plan) sent at the
// same time, p50 and p99, flat out (runPhase) and then paced at the goals'
// load (runPaced). In the same run, before the API starts, the ceiling of
// each phase: the same etcd writes of a create (the owner's uid read and
// the create transaction) and the same read of a GET (spec, status and
// warning in one serializable transaction), with the same concurrency,
// with no HTTP, admission or planning. The API process runs with the GOGC
// that deploy/systemd/api.env sets. It also reports the API process's peak
// resident memory (VmHWM of that process alone), how long it took to list
// its caches, and the mean time of its queue plans.
func BenchmarkAPIScale(b *testing.B) {
	bin := *scaleBin
	if bin == "" {
		bin = buildVoyager(b)
	}
	for i := 0; i < b.N; i++ {
		benchAPIScale(b, bin, *scaleNodes, *scaleSessions)
	}
}

// buildVoyager builds cmd/voyager into a temporary directory.
func buildVoyager(b *testing.B) string {
	out := filepath.Join(b.TempDir(), "voyager")
	cmd := exec.Command("go", "build", "-ldflags=-extldflags=-Wl,-z,lazy", "-o", out, "github.com/voyager-gpu/voyager/cmd/voyager")
	if msg, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build voyager: %v\n%s", err, msg)
	}
	return out
}

// scaleNode is a simulated 8-GPU node with NVLink between every pair and
// two NUMA nodes, as large GPU machines have.
func scaleNode(name string) state.Node {
	n := state.Node{Name: name, Address: "10.0.0.1", CPUMilli: 128000, MemoryMiB: 1 << 20, Ports: state.PortRange{First: 40000, Last: 40999},
		Simulated: true, Registered: time.Now().UTC()}
	for i := 0; i < 8; i++ {
		g := state.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", name, i), Model: "NVIDIA A100-SXM4-80GB (simulated)", MemoryMiB: 81920, NUMANode: i / 4, Healthy: true}
		for j := 0; j < 8; j++ {
			if j != i {
				g.NVLinkPeers = append(g.NVLinkPeers, fmt.Sprintf("GPU-%s-%d", name, j))
			}
		}
		n.GPUs = append(n.GPUs, g)
	}
	return n
}

// scaleSession is a queued notebook of gpus GPUs for owner.
func scaleSession(owner string, gpus int, now time.Time) (state.Session, error) {
	id, err := state.NewSessionID(now)
	if err != nil {
		return state.Session{}, err
	}
	return state.Session{ID: id, Owner: owner, Kind: state.KindNotebook, Image: "voyager/jupyter:latest", Created: now,
		Resources: state.Resources{GPUs: gpus, CPUMilli: int64(gpus) * 4000, MemoryMiB: int64(gpus) * 16384}}, nil
}

// latencies collects request times from several goroutines.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// quantile returns the q-quantile (nearest rank) of the samples.
func (l *latencies) quantile(q float64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0
	}
	sort.Slice(l.d, func(i, j int) bool { return l.d[i] < l.d[j] })
	return l.d[min(len(l.d)-1, int(q*float64(len(l.d))))]
}

func (l *latencies) n() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.d)
}

// phase is one measured phase: creates from scaleCreators goroutines until
// scaleCreates are done, and GETs from scaleGetters goroutines until the
// creates are done and at least scaleCreates GETs are.
type phase struct {
	creates, gets latencies
	elapsed       time.Duration
}

func runPhase(b *testing.B, create func(i int) error, get func(i int) error) *phase {
	p := &phase{}
	var next, done atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < scaleCreators; w++ {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= scaleCreates || firstErr.Load() != nil {
					return
				}
				t0 := time.Now()
				if err := create(i); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				p.creates.add(time.Since(t0))
				if done.Add(1) == scaleCreates {
					p.elapsed = time.Since(start)
				}
			}
		})
	}
	for w := 0; w < scaleGetters; w++ {
		wg.Go(func() {
			for i := w; ; i += scaleGetters {
				if firstErr.Load() != nil || (done.Load() >= scaleCreates && p.gets.n() >= scaleCreates) {
					return
				}
				t0 := time.Now()
				if err := get(i); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				p.gets.add(time.Since(t0))
			}
		})
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		b.Fatal(err)
	}
	return p
}

// The paced phase: creates at the rate the goal names and GETs
// beside them, each sent at its place on a fixed schedule whether or not
// earlier ones have answered (open loop), its latency measured from that
// place (a request the server delays delays none after it, so a backlog
// counts instead of hiding: no coordinated omission). The flat-out phase
// (runPhase) measures how many creates per second the API can take; at
// that rate every request queues behind the others for two cores, so its
// p99s are those of a saturated machine. This phase measures the p99s at
// the load the goals are stated for: 200 creates/s.
const (
	pacedCreatesPerSec = 200
	pacedGetsPerSec    = 400
)

// pacedFor is how long the paced phase sends: 5 s is 1,000 creates and
// 2,000 GETs. A longer phase takes in more of the API's garbage
// collections, which come every several seconds; the API caps each user's
// queued sessions (100), and 50 users share the creates, so 20 s is the
// most a run on a full site can take.
var pacedFor = flag.Duration("scale.paced", 5*time.Second, "BenchmarkAPIScale: how long the paced phase sends (at most 20s on a full site: the per-user queue cap)")

func runPaced(b *testing.B, create func(i int) error, get func(i int) error) *phase {
	p := &phase{}
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	schedule := func(rate int, lat *latencies, do func(i int) error) {
		n := int((*pacedFor).Seconds() * float64(rate))
		every := time.Second / time.Duration(rate)
		for i := 0; i < n && firstErr.Load() == nil; i++ {
			t0 := start.Add(time.Duration(i) * every)
			time.Sleep(time.Until(t0))
			wg.Go(func() {
				if err := do(i); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				lat.add(time.Since(t0))
			})
		}
	}
	var senders sync.WaitGroup
	senders.Go(func() { schedule(pacedCreatesPerSec, &p.creates, create) })
	senders.Go(func() { schedule(pacedGetsPerSec, &p.gets, get) })
	senders.Wait()
	wg.Wait()
	p.elapsed = time.Since(start)
	if err, _ := firstErr.Load().(error); err != nil {
		b.Fatal(err)
	}
	return p
}

func benchAPIScale(b *testing.B, bin string, nodes, queued int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := etcdtest.Start(b, etcdtest.Options{Fsync: true})
	cli := c.Client(b)
	k := state.MustKeys(state.DefaultPrefix)

	// Load generator: nodes under leases it keeps alive (100 to a lease
	// and to a transaction), then the queue, 32 creates at a time.
	genStart := time.Now()
	scalebench.RegisterNodes(b, ctx, cli, k, nodes, func(i int) state.Node { return scaleNode(fmt.Sprintf("sim%05d", i)) })
	sizes := []int{1, 1, 1, 2, 2, 4, 8}
	rng := rand.New(rand.NewSource(42))
	gpus := make([]int, queued)
	for i := range gpus {
		gpus[i] = sizes[rng.Intn(len(sizes))]
	}
	ids := make([]string, queued)
	var wg sync.WaitGroup
	var nextQ atomic.Int64
	var genErr atomic.Value
	for w := 0; w < 32; w++ {
		wg.Go(func() {
			for {
				i := int(nextQ.Add(1)) - 1
				if i >= queued {
					return
				}
				now := time.Now().UTC()
				s, err := scaleSession(fmt.Sprintf("user%d", i%7), gpus[i], now)
				if err == nil {
					_, err = state.CreateSession(ctx, cli, k, s, now)
				}
				if err != nil {
					genErr.CompareAndSwap(nil, err)
					return
				}
				ids[i] = s.ID
			}
		})
	}
	wg.Wait()
	if err, _ := genErr.Load().(error); err != nil {
		b.Fatal(err)
	}
	b.Logf("load generator: %d nodes, %d sessions queued in %s", nodes, queued, time.Since(genStart).Round(time.Millisecond))
	site := "empty"
	if *scaleFill {
		ids = fillSite(b, ctx, cli, k, bin, c.Server.Endpoint(), nodes)
		queued, site = len(ids), "full"
	}

	// The ceiling: the etcd work of a create and of a GET, nothing else.
	ceilCreate := func(i int) error {
		now := time.Now().UTC()
		s, err := scaleSession(fmt.Sprintf("ceiling%d", i%scaleUsers), sizes[i%len(sizes)], now)
		if err != nil {
			return err
		}
		uid, err := state.EnsureUID(ctx, cli, k, s.Owner, now)
		if err != nil {
			return err
		}
		s.UID = &uid
		_, err = state.CreateSession(ctx, cli, k, s, now)
		return err
	}
	// A GET's read, as the API makes it (readSessionServing): serializable.
	ceilGet := func(i int) error {
		id := ids[(i*7919)%len(ids)]
		_, err := cli.Txn(ctx).Then(clientv3.OpGet(k.Session(id), clientv3.WithSerializable()),
			clientv3.OpGet(k.Status(id), clientv3.WithSerializable()), clientv3.OpGet(k.Warning(id), clientv3.WithSerializable())).Commit()
		return err
	}
	ceil := runPhase(b, ceilCreate, ceilGet)
	ceilPaced := runPaced(b, ceilCreate, ceilGet)

	// The API process.
	secret := "scale-bench-secret-0123456789abcdef-0123456789"
	gogc := scalebench.DeployedGOGC(b, "api")
	proc := scalebench.Start(b, bin, "api", c.Server.Endpoint(),
		"VOYAGER_JWT_SECRET="+secret, "VOYAGER_API_RATE=1000000", "VOYAGER_API_BURST=1000000", "VOYAGER_LOG_LEVEL=warn", "GOGC="+gogc)
	procStart := proc.Started
	base := "http://" + proc.Addr
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	for {
		resp, err := client.Get(base + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case err := <-proc.Exited:
			b.Fatalf("voyager api exited before it was ready: %v (log %s)", err, proc.Log)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Since(procStart) > 10*time.Minute {
			b.Fatalf("voyager api not ready in 10 minutes (log %s)", proc.Log)
		}
	}
	ready := time.Since(procStart)
	// Steady state: the API plans the queue once its caches are in; the
	// requests measured start after that first plan.
	for metric(b, proc, client, "voyager_api_queue_plan_seconds_count") == 0 {
		select {
		case err := <-proc.Exited:
			b.Fatalf("voyager api exited before its first queue plan: %v (log %s)", err, proc.Log)
		case <-time.After(500 * time.Millisecond): // a scrape counts the whole cluster: not too often
		}
	}
	planned := time.Since(procStart)
	toks := make([]string, scaleUsers)
	for u := range toks {
		var err error
		if toks[u], err = jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": fmt.Sprintf("bench%d", u), "exp": time.Now().Add(time.Hour).Unix()}).SignedString([]byte(secret)); err != nil {
			b.Fatal(err)
		}
	}
	send := func(tok, method, path string, body []byte, want int) ([]byte, error) {
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		req, _ := http.NewRequest(method, base+path, rd)
		req.Header.Set("Authorization", "Bearer "+tok)
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != want {
			err = fmt.Errorf("%s %s: %d, want %d: %s", method, path, resp.StatusCode, want, out)
		}
		return out, err
	}
	bodies := make([][]byte, len(sizes))
	for i, g := range sizes {
		bodies[i], _ = json.Marshal(map[string]any{"kind": "notebook", "image": "voyager/jupyter:latest",
			"resources": map[string]any{"gpus": g, "cpuMilli": g * 4000, "memoryMiB": g * 16384}})
	}
	// The GETs read the load generator's sessions, whose owners are
	// user0…6: an admin token sees them.
	admin, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "bench-admin", "roles": []string{"admin"}, "exp": time.Now().Add(time.Hour).Unix()}).SignedString([]byte(secret))
	if err != nil {
		b.Fatal(err)
	}
	var positioned atomic.Int64
	apiCreate := func(i int) error {
		_, err := send(toks[i%scaleUsers], "POST", "/api/v1/sessions", bodies[i%len(bodies)], http.StatusCreated)
		return err
	}
	apiGet := func(i int) error {
		id := ids[(i*7919)%len(ids)]
		req, _ := http.NewRequest("GET", base+"/api/v1/sessions/"+id, nil)
		req.Header.Set("Authorization", "Bearer "+admin)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var v struct {
			Status state.Status `json:"status"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET session %s: %d %v", id, resp.StatusCode, err)
		}
		if v.Status.QueuePosition > 0 {
			positioned.Add(1)
		}
		return nil
	}
	api := runPhase(b, apiCreate, apiGet)
	paced := runPaced(b, apiCreate, apiGet)
	hwm, _ := proc.Usage(b)
	rereads := metric(b, proc, client, "voyager_api_session_rereads_total")
	planMean := time.Duration(metric(b, proc, client, "voyager_api_queue_plan_seconds_sum") / max(1, metric(b, proc, client, "voyager_api_queue_plan_seconds_count")) * float64(time.Second))

	label := fmt.Sprintf("api at %d nodes x 8 GPUs, %s, %d queued", nodes, site, queued)
	rate, ceilRate := float64(scaleCreates)/api.elapsed.Seconds(), float64(scaleCreates)/ceil.elapsed.Seconds()
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(rate, "creates/s")
	b.ReportMetric(ms(api.creates.quantile(0.5)), "create-p50-ms")
	b.ReportMetric(ms(api.creates.quantile(0.99)), "create-p99-ms")
	b.ReportMetric(ms(api.gets.quantile(0.5)), "get-p50-ms")
	b.ReportMetric(ms(api.gets.quantile(0.99)), "get-p99-ms")
	b.ReportMetric(ceilRate, "ceiling-creates/s")
	b.ReportMetric(float64(hwm)/1024, "api-peak-rss-MiB")
	benchsum.Add(b, benchsum.Row{Figure: label + ": creates/s", Value: rate, Unit: "creates/s", Ceiling: ceilRate, CeilingName: "the same etcd writes, no API"})
	benchsum.Add(b, benchsum.Row{Figure: label + ": create p50", Value: ms(api.creates.quantile(0.5)), Unit: "ms", Ceiling: ms(ceil.creates.quantile(0.5)), CeilingName: "the same etcd writes, no API"})
	benchsum.Add(b, benchsum.Row{Figure: label + ": create p99", Value: ms(api.creates.quantile(0.99)), Unit: "ms", Ceiling: ms(ceil.creates.quantile(0.99)), CeilingName: "the same etcd writes, no API"})
	benchsum.Add(b, benchsum.Row{Figure: label + ": GET pending session p50", Value: ms(api.gets.quantile(0.5)), Unit: "ms", Ceiling: ms(ceil.gets.quantile(0.5)), CeilingName: "the same etcd read, no API"})
	benchsum.Add(b, benchsum.Row{Figure: label + ": GET pending session p99", Value: ms(api.gets.quantile(0.99)), Unit: "ms", Ceiling: ms(ceil.gets.quantile(0.99)), CeilingName: "the same etcd read, no API"})
	b.ReportMetric(ms(paced.creates.quantile(0.99)), "paced-create-p99-ms")
	b.ReportMetric(ms(paced.gets.quantile(0.99)), "paced-get-p99-ms")
	pacedLabel := fmt.Sprintf("%s, %d creates/s + %d GETs/s open loop", label, pacedCreatesPerSec, pacedGetsPerSec)
	for _, r := range []struct {
		what      string
		api, ceil *latencies
		q         float64
	}{{"create p50", &paced.creates, &ceilPaced.creates, 0.5}, {"create p99", &paced.creates, &ceilPaced.creates, 0.99},
		{"GET pending session p50", &paced.gets, &ceilPaced.gets, 0.5}, {"GET pending session p99", &paced.gets, &ceilPaced.gets, 0.99}} {
		benchsum.Add(b, benchsum.Row{Figure: pacedLabel + ": " + r.what, Value: ms(r.api.quantile(r.q)), Unit: "ms",
			Ceiling: ms(r.ceil.quantile(r.q)), CeilingName: "the same etcd work on the same schedule, no API"})
	}
	benchsum.Add(b, benchsum.Row{Figure: label + ": API peak RSS", Value: float64(hwm) / 1024, Unit: "MiB"})
	b.Logf("%s: API ready %s after start, first queue plan done %s after start; %d creates at %.0f/s (p50 %s, p99 %s), %d GETs (p50 %s, p99 %s, %d with a queue position); ceiling %.0f creates/s (p50 %s, p99 %s), GET p50 %s p99 %s; queue plan mean %s; API peak RSS %.0f MiB (GOGC=%s, as deploy/systemd/api.env sets it); %.0f GETs read again linearizably",
		label, ready.Round(time.Millisecond), planned.Round(time.Millisecond), api.creates.n(), rate, api.creates.quantile(0.5), api.creates.quantile(0.99),
		api.gets.n(), api.gets.quantile(0.5), api.gets.quantile(0.99), positioned.Load(),
		ceilRate, ceil.creates.quantile(0.5), ceil.creates.quantile(0.99), ceil.gets.quantile(0.5), ceil.gets.quantile(0.99),
		planMean.Round(time.Millisecond), float64(hwm)/1024, gogc, rereads)
	b.Logf("%s: %d creates (p50 %s, p99 %s), %d GETs (p50 %s, p99 %s); the same etcd work on the same schedule: creates p50 %s p99 %s, GETs p50 %s p99 %s",
		pacedLabel, paced.creates.n(), paced.creates.quantile(0.5), paced.creates.quantile(0.99), paced.gets.n(), paced.gets.quantile(0.5), paced.gets.quantile(0.99),
		ceilPaced.creates.quantile(0.5), ceilPaced.creates.quantile(0.99), ceilPaced.gets.quantile(0.5), ceilPaced.gets.quantile(0.99))
	if positioned.Load() == 0 {
		b.Fatalf("no GET of a pending session carried a queue position: the API's queue plan never answered")
	}
}

// fillSite runs a real `voyager placer` until it has bound nothing for
// 3 s, stops it, and requires every GPU allocated with sessions still
// queued, so that the API meets the state of a site whose queue waits: its
// plans find no room instead of placing a cluster's worth each time. It
// returns the ids of the sessions still queued.
func fillSite(b *testing.B, ctx context.Context, cli *clientv3.Client, k state.Keys, bin, endpoint string, nodes int) []string {
	start := time.Now()
	proc := scalebench.Start(b, bin, "placer", endpoint, "VOYAGER_LOG_LEVEL=warn", "GOGC="+scalebench.DeployedGOGC(b, "placer"))
	metrics := &http.Client{Timeout: 5 * time.Second}
	var bound float64
	last := time.Now()
	for {
		if m, err := proc.Metrics(metrics); err == nil && m["voyager_placer_bindings_total"] != bound {
			bound, last = m["voyager_placer_bindings_total"], time.Now()
		}
		if bound > 0 && time.Since(last) > 3*time.Second {
			break
		}
		select {
		case err := <-proc.Exited:
			b.Fatalf("voyager placer exited before the nodes filled: %v (log %s)", err, proc.Log)
		case <-time.After(200 * time.Millisecond):
		}
		if time.Since(start) > 30*time.Minute {
			b.Fatalf("the nodes did not fill within 30 minutes (log %s)", proc.Log)
		}
	}
	proc.Stop()
	resp, err := cli.Get(ctx, k.Ledgers(), clientv3.WithPrefix())
	if err != nil {
		b.Fatal(err)
	}
	gpus := 0
	for _, kv := range resp.Kvs {
		l, err := state.Decode[state.Ledger](kv.Value)
		if err != nil {
			b.Fatal(err)
		}
		gpus += len(l.GPUOwners())
	}
	pend, err := cli.Get(ctx, k.PendingDir(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, 0, len(pend.Kvs))
	for _, kv := range pend.Kvs {
		if id, ok := k.SessionID(string(kv.Key)); ok {
			ids = append(ids, id)
		}
	}
	switch {
	case len(ids) == 0:
		b.Fatalf("the queue emptied with %d of %d GPUs allocated: queue more sessions (-scale.sessions) than %d nodes hold", gpus, nodes*8, nodes)
	case gpus != nodes*8:
		b.Fatalf("the placer stopped binding with %d of %d GPUs allocated and %d sessions queued (log %s)", gpus, nodes*8, len(ids), proc.Log)
	}
	b.Logf("voyager placer filled %d nodes (%.0f sessions, %d GPUs) in %s; %d sessions still queued", nodes, bound, gpus, time.Since(start).Round(time.Millisecond), len(ids))
	return ids
}

// metric reads one sample of the process's metrics (0 when absent).
func metric(b *testing.B, p *scalebench.Proc, client *http.Client, name string) float64 {
	m, err := p.Metrics(client)
	if err != nil {
		b.Fatal(err)
	}
	return m[name]
}
