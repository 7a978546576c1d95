package nodeagent_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/benchsum"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	vrt "github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
	"github.com/voyager-gpu/voyager/state"
)

// benchSessions is how many sessions one iteration binds at once.
const benchSessions = 50

// BenchmarkAgentBindToRunning binds 50 notebook sessions to the node at
// once, on real containerd, and measures from each bind's commit to its
// Running status (the container started and its port answering HTTP: the
// busybox image's stand-in Jupyter), first with sessions on the host's
// network, the ceiling, then each in its own network namespace on the CNI
// bridge (the default, isolated). With all 50 running it reports the
// memory at rest. Then it stops them all. Every iteration binds 50
// sessions per mode: -benchtime 20x gives 1000 samples of each.
//
// Metrics: p50-ms and p99-ms of bind→Running with isolated networking;
// host-p50-ms and host-p99-ms on the host's network; p50-x-host and
// p99-x-host their ratios (the cost of a network of one's own); rss-MiB is
// this process's resident memory — the agent and the benchmark's few
// watches, since etcd runs in its own process (Debian's etcd-server) and
// containerd in its own — and heap-MiB the Go heap in use after a GC, both
// in the host phase. hop-p50-ms and hop-p99-ms are the part of
// bind→Running (isolated) that the status merger adds: from the agent's
// Running part (parts/<node>/<id>) to the Running status the merger
// writes, both seen on one watch in revision order; hop-share-p50 is the
// median hop over the median bind→Running.
func BenchmarkAgentBindToRunning(b *testing.B) {
	host, _, rssMiB, heapMiB := bindToRunning(b, vrt.NetworkOptions{})
	iso, hops, _, _ := bindToRunning(b, vrt.NetworkOptions{Mode: vrt.NetworkIsolated, Name: fmt.Sprintf("bench-%d", os.Getpid()), StateDir: b.TempDir()})
	b.ReportMetric(pct(hops, 0.50), "hop-p50-ms")
	b.ReportMetric(pct(hops, 0.99), "hop-p99-ms")
	b.ReportMetric(pct(hops, 0.50)/pct(iso, 0.50), "hop-share-p50")
	b.ReportMetric(pct(iso, 0.50), "p50-ms")
	b.ReportMetric(pct(iso, 0.99), "p99-ms")
	b.ReportMetric(pct(host, 0.50), "host-p50-ms")
	b.ReportMetric(pct(host, 0.99), "host-p99-ms")
	b.ReportMetric(pct(iso, 0.50)/pct(host, 0.50), "p50-x-host")
	b.ReportMetric(pct(iso, 0.99)/pct(host, 0.99), "p99-x-host")
	b.ReportMetric(rssMiB, "rss-MiB")
	b.ReportMetric(heapMiB, "heap-MiB")
	for _, q := range []float64{0.50, 0.99} {
		benchsum.Add(b, benchsum.Row{Figure: fmt.Sprintf("agent bind->Running p%.0f, isolated network (busybox stand-in, %d samples)", q*100, len(iso)),
			Value: pct(iso, q), Unit: "ms", Ceiling: pct(host, q), CeilingName: "host network, same run"})
	}
}

// pct is the p-quantile of lat in milliseconds.
func pct(lat []time.Duration, p float64) float64 {
	lat = slices.Clone(lat)
	slices.Sort(lat)
	return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
}

// bindToRunning runs b.N rounds of 50 sessions on an agent whose runtime
// has network net, and returns every bind→Running latency and the memory
// at rest after the first round.
func bindToRunning(b *testing.B, net vrt.NetworkOptions) (lat, hops []time.Duration, rssMiB, heapMiB float64) {
	cli := etcdtest.StartExternal(b).Client(b)
	rt := runtimetest.New(b, vrt.ContainerdOptions{Network: net})
	cfg := testConfig(b, cli, rt)
	cfg.Image = runtimetest.ImageRef
	cfg.GPUs, cfg.StopGrace = nil, 2*time.Second
	_, stop := runAgent(b, cfg)
	defer stop()
	ctx := context.Background()
	for n := 0; n < b.N; n++ {
		resp, err := cli.Get(ctx, "/", clientv3.WithCountOnly())
		if err != nil {
			b.Fatal(err)
		}
		// One watch over parts and statuses: their events come in
		// revision order, so a part's Running precedes its status's.
		wch := cli.Watch(ctx, keys.All(), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		partRunning := map[string]time.Time{}
		bound := map[string]time.Time{}
		var ids []string
		used := map[int]bool{} // freePort may hand out a port twice in a row
		for i := range benchSessions {
			id := fmt.Sprintf("b%d-%03d", n, i)
			ids = append(ids, id)
			port := freePort(b)
			for used[port] {
				port = freePort(b)
			}
			used[port] = true
			bind(b, cli, state.Session{ID: id, Owner: "ada", Kind: state.KindNotebook},
				state.Binding{CPUMilli: 100, MemoryMiB: 64, Ports: []int{port}})
			bound[id] = time.Now()
		}
		running := map[string]bool{}
		deadline := time.After(5 * time.Minute)
		for len(running) < benchSessions {
			select {
			case wr := <-wch:
				for _, ev := range wr.Events {
					key := string(ev.Kv.Key)
					if _, id, ok := keys.PartKey(key); ok && ev.Type == clientv3.EventTypePut {
						if p, err := state.Decode[state.PartStatus](ev.Kv.Value); err == nil && p.Phase == state.PhaseRunning && partRunning[id].IsZero() {
							partRunning[id] = time.Now()
						}
						continue
					}
					if !strings.HasPrefix(key, keys.StatusDir()) {
						continue
					}
					st, err := state.Decode[state.Status](ev.Kv.Value)
					if err != nil || running[st.Session] {
						continue
					}
					switch st.Phase {
					case state.PhaseRunning:
						running[st.Session] = true
						lat = append(lat, time.Since(bound[st.Session]))
						if at := partRunning[st.Session]; !at.IsZero() {
							hops = append(hops, time.Since(at))
						}
					case state.PhaseFailed:
						b.Fatalf("%s failed: %s", st.Session, st.Message)
					}
				}
			case <-deadline:
				b.Fatalf("%d of %d sessions Running after 5 minutes", len(running), benchSessions)
			}
		}
		b.StopTimer()
		if n == 0 {
			rssMiB, heapMiB = memoryAtRest(b)
			if infos, _ := rt.List(ctx, nil); len(infos) != benchSessions {
				b.Fatalf("%d containers for %d sessions", len(infos), benchSessions)
			}
		}
		for _, id := range ids {
			s, _, _ := state.Get[state.Session](ctx, cli, keys.Session(id))
			s.Desired = state.DesiredStopped
			if _, err := state.Put(ctx, cli, keys.Session(id), s); err != nil {
				b.Fatal(err)
			}
		}
		waitFor(b, "every container removed", 5*time.Minute, func() (bool, string) {
			infos, _ := rt.List(ctx, nil)
			return len(infos) == 0, strconv.Itoa(len(infos))
		})
		b.StartTimer()
	}
	return lat, hops, rssMiB, heapMiB
}

// memoryAtRest waits a moment for the agent to settle, then reads the
// process's resident memory and the Go heap in use after a GC.
func memoryAtRest(b *testing.B) (rssMiB, heapMiB float64) {
	settle := time.NewTimer(2 * time.Second)
	<-settle.C
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			rssMiB = kb / 1024
		}
	}
	return rssMiB, float64(ms.HeapInuse) / (1 << 20)
}
