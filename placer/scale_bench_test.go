package placer

import (
	"context"
	"flag"
	"fmt"
	"math/rand"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/benchsum"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/internal/scalebench"
	"github.com/voyager-gpu/voyager/state"
)

// The scale run's parameters; `make bench-scale` sets them.
var (
	scaleBin      = flag.String("scale.bin", "", "path of a built voyager binary: BenchmarkPlacementScale runs `voyager placer` from it (make bench-scale builds bin/voyager and passes it)")
	scaleNodes    = flag.Int("scale.nodes", 1000, "BenchmarkPlacementScale: lease-backed 8-GPU nodes the load generator registers")
	scaleSessions = flag.Int("scale.sessions", 20000, "BenchmarkPlacementScale: sessions of mixed sizes queued before the placer starts")
)

// BenchmarkPlacementScale is the large-site run (`make bench-scale`): a
// load generator registers scale.nodes simulated 8-GPU nodes under leases
// it keeps alive (one lease per 100 nodes) and queues scale.sessions
// sessions of mixed sizes on a real etcd with fsync; then one real
// `voyager placer` process starts. It reports the time from the process's
// start to its first binding (sync and first pass) and to a full cluster,
// bindings per second between the first and the last binding, the placer
// process's CPU time per binding until full and its peak resident memory
// (VmHWM of that process alone) once its lifecycle controller, which
// starts after the placer's first pass, has listed its caches too. It needs a built binary (-scale.bin), so `make bench`
// passes over it.
func BenchmarkPlacementScale(b *testing.B) {
	if *scaleBin == "" {
		b.Skip("runs under make bench-scale, which builds bin/voyager and passes -scale.bin")
	}
	for i := 0; i < b.N; i++ {
		benchScale(b, *scaleBin, *scaleNodes, *scaleSessions)
	}
}

func benchScale(b *testing.B, bin string, nodes, sessions int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := etcdtest.Start(b, etcdtest.Options{Fsync: true})
	cli := c.Client(b)
	s := newSim(b, cli)

	// Load generator: nodes under leases it keeps alive, 100 to a lease
	// and to a transaction.
	genStart := time.Now()
	scalebench.RegisterNodes(b, ctx, cli, s.k, nodes, func(i int) state.Node {
		n := gpuNode(fmt.Sprintf("sim%05d", i), 8, "NVIDIA A100-SXM4-80GB (simulated)")
		n.Simulated = true
		n.Registered = time.Now().UTC()
		return n
	})
	submitAll(b, ctx, s, benchSizes(rand.New(rand.NewSource(42)), sessions), 64, nil)
	b.Logf("load generator: %d nodes, %d sessions queued in %s", nodes, sessions, time.Since(genStart).Round(time.Millisecond))

	var mu sync.Mutex
	var first, last time.Time
	bound, gpus := 0, 0
	boundWatch(b, ctx, cli, s.k, func(bd state.Binding, _ int64) {
		mu.Lock()
		defer mu.Unlock()
		if bound == 0 {
			first = time.Now()
		}
		bound++
		gpus += len(bd.GPUs)
		last = time.Now()
	})

	// As deployed: deploy/systemd/placer.env sets its GOGC.
	proc := scalebench.Start(b, bin, "placer", c.Server.Endpoint(), "GOGC="+scalebench.DeployedGOGC(b, "placer"))
	procStart := proc.Started
	// Full: every GPU bound, or no binding for 3 s after the first. The
	// placer's metrics are read every 100 ms for its cache lag.
	deadline := time.Now().Add(30 * time.Minute)
	var maxLag, conflicts, txns, passes float64
	metrics := &http.Client{Timeout: 5 * time.Second}
	for {
		if m, err := proc.Metrics(metrics); err == nil {
			maxLag = max(maxLag, m["voyager_placer_cache_lag_revisions"])
			conflicts, txns = m["voyager_placer_conflicts_total"], m["voyager_placer_bind_transactions_total"]
			passes = m["voyager_placer_passes_total"]
		}
		mu.Lock()
		full := gpus == nodes*8 || (bound > 0 && time.Since(last) > 3*time.Second)
		mu.Unlock()
		if full {
			break
		}
		select {
		case err := <-proc.Exited:
			b.Fatalf("voyager placer exited before the cluster filled: %v (log %s)", err, proc.Log)
		default:
		}
		if time.Now().After(deadline) {
			b.Fatalf("the cluster did not fill within 30 minutes (log %s)", proc.Log)
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, cpu := proc.Usage(b)
	fullAt := time.Now()
	// The process's lifecycle controller lists every session and status
	// once the placer's first pass has ended: the peak resident memory is
	// read once it has (it leads: the only process).
	for {
		if m, err := proc.Metrics(metrics); err == nil && m["voyager_lifecycle_leader"] == 1 {
			break
		}
		select {
		case err := <-proc.Exited:
			b.Fatalf("voyager placer exited before its lifecycle controller synced: %v (log %s)", err, proc.Log)
		default:
		}
		if time.Now().After(deadline) {
			b.Fatalf("the lifecycle controller did not sync within 30 minutes (log %s)", proc.Log)
		}
		time.Sleep(100 * time.Millisecond)
	}
	hwm, _ := proc.Usage(b)
	// Passes once full: the queue still holds sessions, but nothing
	// changes that could let one fit, so every pass of the afterFull
	// after the cluster filled is planning for nothing.
	const afterFull = 5 * time.Second
	time.Sleep(time.Until(fullAt.Add(afterFull)))
	m, err := proc.Metrics(metrics)
	if err != nil {
		b.Fatalf("read the placer's metrics: %v", err)
	}
	idlePasses := m["voyager_placer_passes_total"] - passes
	st, err := cli.Status(ctx, c.Server.Endpoint())
	if err != nil {
		b.Fatal(err)
	}
	dbMiB := float64(st.DbSize) / (1 << 20)
	mu.Lock()
	n, g, toFirst, toFull, span := bound, gpus, first.Sub(procStart), last.Sub(procStart), last.Sub(first)
	mu.Unlock()
	rate := float64(n) / span.Seconds()
	b.ReportMetric(toFirst.Seconds(), "s-to-first-binding")
	b.ReportMetric(toFull.Seconds(), "s-to-full")
	b.ReportMetric(rate, "bindings/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(max(n, 1)), "placer-cpu-us/binding")
	b.ReportMetric(float64(hwm)/1024, "placer-peak-rss-MiB")
	b.ReportMetric(maxLag, "max-cache-lag-revs")
	b.ReportMetric(passes, "passes-until-full")
	b.ReportMetric(idlePasses, "passes-5s-after-full")
	b.ReportMetric(conflicts, "conflicts")
	b.ReportMetric(dbMiB, "etcd-db-MiB")
	label := fmt.Sprintf("scale %d nodes x 8 GPUs, %d queued", nodes, sessions)
	benchsum.Add(b, benchsum.Row{Figure: label + ": bindings/s", Value: rate, Unit: "bindings/s"})
	benchsum.Add(b, benchsum.Row{Figure: label + ": time to full (from placer start)", Value: toFull.Seconds(), Unit: "s"})
	benchsum.Add(b, benchsum.Row{Figure: label + ": placer peak RSS", Value: float64(hwm) / 1024, Unit: "MiB"})
	benchsum.Add(b, benchsum.Row{Figure: label + ": placer CPU per binding", Value: float64(cpu.Microseconds()) / float64(max(n, 1)), Unit: "µs"})
	benchsum.Add(b, benchsum.Row{Figure: label + ": placer cache lag at most", Value: maxLag, Unit: "revisions"})
	benchsum.Add(b, benchsum.Row{Figure: label + ": etcd db size", Value: dbMiB, Unit: "MiB"})
	b.Logf("%s: voyager placer's first binding %s after start, full (%d sessions, %d of %d GPUs) %s after start; %.0f bindings/s; placer CPU until full %s (%.0f µs/binding), peak RSS with the lifecycle controller's caches listed %.0f MiB; %.0f bind txns, %.0f conflicts, %.0f passes until full and %.0f in the %s after; cache lag at most %.0f revisions; etcd db %.0f MiB",
		label, toFirst.Round(time.Millisecond), n, g, nodes*8, toFull.Round(time.Millisecond), rate, cpu.Round(time.Millisecond),
		float64(cpu.Microseconds())/float64(max(n, 1)), float64(hwm)/1024, txns, conflicts, passes, idlePasses, afterFull, maxLag, dbMiB)
}
