package console_test

import (
	"context"
	"fmt"
	"os/exec"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/benchsum"
	"github.com/voyager-gpu/voyager/internal/browsertest"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// bigCluster writes nodes nodes of 8 GPUs each with sessionsPerNode
// running sessions per node: 8 holding one GPU each (sampled use, one in
// ten flagged unused), the rest CPU-only, with their specs, statuses and
// ledgers.
func bigCluster(b *testing.B, e *env, nodes, sessionsPerNode int) {
	b.Helper()
	ctx := context.Background()
	var ops []clientv3.Op
	flush := func() {
		if len(ops) == 0 {
			return
		}
		if _, err := e.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			b.Fatal(err)
		}
		ops = ops[:0]
	}
	put := func(key string, v any) {
		s, err := state.Encode(v)
		if err != nil {
			b.Fatal(err)
		}
		ops = append(ops, clientv3.OpPut(key, s))
		if len(ops) == 120 {
			flush()
		}
	}
	now := time.Now().UTC()
	started := now.Add(-time.Hour)
	for i := range nodes {
		name := fmt.Sprintf("gpu-%04d", i)
		model := "NVIDIA A100-SXM4-80GB"
		if i%3 == 0 {
			model = "NVIDIA H100 80GB HBM3"
		}
		n := state.Node{Name: name, Address: "10.0.0.1", CPUMilli: 128000, MemoryMiB: 1 << 20, Ports: state.PortRange{First: 40000, Last: 40999}, Registered: now}
		l := state.Ledger{Node: name, Allocations: map[string]state.Allocation{}}
		for g := range 8 {
			n.GPUs = append(n.GPUs, state.GPU{Index: g, UUID: fmt.Sprintf("GPU-%s-%d", name, g), Model: model, MemoryMiB: 81920, Healthy: true})
		}
		put(e.keys.Node(name), n)
		for s := range sessionsPerNode {
			id := fmt.Sprintf("s%04d%02d", i, s)
			owner := fmt.Sprintf("user%03d", (i*sessionsPerNode+s)%200)
			al := state.Allocation{Kind: state.KindBatch, Owner: owner, Role: state.RoleSingle, CPUMilli: 4000, MemoryMiB: 16384}
			st := state.Status{Session: id, Phase: state.PhaseRunning, Nodes: []string{name}, Created: started, Updated: started, Started: &started}
			spec := state.Session{ID: id, Owner: owner, Kind: state.KindBatch, Command: []string{"python", "train.py"}, Resources: state.Resources{CPUMilli: 4000, MemoryMiB: 16384}, Created: started}
			if s < 8 {
				uuid := n.GPUs[s].UUID
				al.GPUs = []string{uuid}
				spec.Resources.GPUs = 1
				st.Activity = &state.Activity{LastActive: now, Sampled: now, GPUs: []state.GPUActivity{{UUID: uuid, UtilizationPercent: (i*7 + s*13) % 100, MemoryUsedMiB: int64(s) * 4096, Unused: (i+s)%10 == 0}}}
			}
			l.Allocations[id] = al
			put(e.keys.Session(id), spec)
			put(e.keys.Status(id), st)
		}
		put(e.keys.Ledger(name), l)
	}
	flush()
}

// BenchmarkClusterPage renders the cluster page of 1,000 nodes (8,000
// GPUs) and 10,000 running sessions. Per op: the view as a plain user
// gets it (server-rendered HTML from the API's node view), with the
// ceiling — the one API call it makes, alone — measured in the same run:
// x-api is the view's time over the API call's. It reports the view's and
// the whole page's weight (shell, script, style, view), the API calls per
// refresh, and, where Chromium is installed, the time from navigation to
// the view's first paint in a headless browser (median of 5) and x-fetch,
// that over the time the page's fetch of the view took.
func BenchmarkClusterPage(b *testing.B) {
	const nodes, perNode = 1000, 10
	e := newEnv(b, etcdtest.New(b))
	bigCluster(b, e, nodes, perNode)
	tok, admin := e.token("ada"), e.token("root", "admin")
	e.waitFor("the caches hold the cluster", func() bool {
		r := e.get("/console/view/cluster", admin)
		return r.code == 200 && len(r.body) > 0 && containsN(r.body, `class="gpu held`, nodes*8)
	})

	var viewBytes, calls int
	timeIt := func(path string) time.Duration {
		start := time.Now()
		r := e.get(path, tok)
		if r.code != 200 {
			b.Fatalf("%s: %d %s", path, r.code, r.body)
		}
		if path == "/console/view/cluster" {
			viewBytes = len(r.body)
			calls, _ = strconv.Atoi(r.header.Get("X-Voyager-API-Calls"))
		}
		return time.Since(start)
	}
	var apiTime, viewTime time.Duration
	b.ResetTimer()
	for b.Loop() {
		apiTime += timeIt("/api/v1/nodes?devices=true")
		viewTime += timeIt("/console/view/cluster")
	}
	b.StopTimer()
	shell := len(e.get("/console/cluster", "").body) + len(e.get("/console/static/app.js", "").body) + len(e.get("/console/static/app.css", "").body)
	b.ReportMetric(float64(viewTime.Microseconds())/float64(b.N)/1000, "view-ms")
	b.ReportMetric(float64(apiTime.Microseconds())/float64(b.N)/1000, "api-ms")
	b.ReportMetric(float64(viewTime)/float64(apiTime), "x-api")
	b.ReportMetric(float64(viewBytes)/1024, "view-KiB")
	b.ReportMetric(float64(viewBytes+shell)/1024, "page-KiB")
	b.ReportMetric(float64(len(e.send("GET", "/console/view/cluster", tok, nil, "Accept-Encoding", "gzip").body))/1024, "view-gzip-KiB")
	b.ReportMetric(float64(calls), "api-calls/refresh")
	benchsum.Add(b, benchsum.Row{Figure: "console cluster view refresh",
		Value: float64(viewTime.Microseconds()) / float64(b.N) / 1000, Unit: "ms",
		Ceiling: float64(apiTime.Microseconds()) / float64(b.N) / 1000, CeilingName: "the nodes API call it wraps"})

	path, err := exec.LookPath("chromium")
	if err != nil {
		b.Log("chromium is not installed (apt-get install -y chromium): no first-render numbers")
		return
	}
	paint, fetch := firstRender(b, path, e.srv.URL+"/console/cluster", tok)
	b.ReportMetric(paint, "first-render-ms")
	b.ReportMetric(paint/fetch, "x-fetch")
}

func containsN(s, sub string, n int) bool {
	count := 0
	for i := 0; i+len(sub) <= len(s) && count < n; i++ {
		if s[i:i+len(sub)] == sub {
			count++
		}
	}
	return count >= n
}

// firstRender loads url signed in with tok five times and returns the
// median time from navigation to the view's first paint, and the median
// time the page's fetch of its view took, in ms.
func firstRender(b *testing.B, chromium, url, tok string) (paint, fetch float64) {
	b.Helper()
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), browsertest.Options(b, chromium, 1366, 900)...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(alloc)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, 5*time.Minute)
	defer cancelT()
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		b.Fatalf("open %s: %v", url, err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(`sessionStorage.setItem("voyager.token", %q); true`, tok))); err != nil {
		b.Fatal(err)
	}
	var paints, fetches []float64
	for range 5 {
		if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
			b.Fatal(err)
		}
		v, err := chromedp.Run(ctx, chromedp.Poll[[]float64](`(() => {
			const p = document.querySelector('#view').dataset.painted;
			const f = performance.getEntriesByType('resource').find(r => r.name.endsWith('/console/view/cluster'));
			return p && f ? [Number(p), f.responseEnd - f.startTime] : null })()`, chromedp.WithPollingTimeout(2*time.Minute)))
		if err != nil {
			b.Fatalf("wait for the view's first paint: %v", err)
		}
		paints, fetches = append(paints, v[0]), append(fetches, v[1])
	}
	return median(paints), median(fetches)
}

func median(v []float64) float64 {
	sort.Float64s(v)
	return v[len(v)/2]
}
