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
// busybox image's stand-in Jupyter). With all 50 running it reports the
// memory at rest. Then it stops them all.
//
// Metrics: p50-ms and p99-ms of bind→Running; rss-MiB is this process's
// resident memory — the agent and the benchmark's few watches, since etcd
// runs in its own process (Debian's etcd-server) and containerd in its own —
// and heap-MiB the Go heap in use after a GC.
func BenchmarkAgentBindToRunning(b *testing.B) {
	cli := etcdtest.StartExternal(b).Client(b)
	rt := runtimetest.New(b, vrt.ContainerdOptions{})
	cfg := testConfig(b, cli, rt)
	cfg.Image = runtimetest.ImageRef
	cfg.GPUs, cfg.StopGrace = nil, 2*time.Second
	runAgent(b, cfg)
	ctx := context.Background()
	var lat []time.Duration
	var rssMiB, heapMiB float64
	for n := 0; n < b.N; n++ {
		resp, err := cli.Get(ctx, "/", clientv3.WithCountOnly())
		if err != nil {
			b.Fatal(err)
		}
		wch := cli.Watch(ctx, keys.StatusDir(), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
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
					st, err := state.Decode[state.Status](ev.Kv.Value)
					if err != nil || running[st.Session] {
						continue
					}
					switch st.Phase {
					case state.PhaseRunning:
						running[st.Session] = true
						lat = append(lat, time.Since(bound[st.Session]))
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
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(rssMiB, "rss-MiB")
	b.ReportMetric(heapMiB, "heap-MiB")
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
