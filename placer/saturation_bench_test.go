package placer

import (
	"context"
	"fmt"
	"math/rand"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/benchsum"
	"github.com/voyager-gpu/voyager/state"
)

// BenchmarkPlacementLatencySaturated measures pending→bound latency with
// the cluster kept full and the queue kept non-empty: 100 × 8 GPUs are
// filled by a first queue with a backlog behind it, every bound session is
// released after 1–3 s (its agent finishing), and 1,500 more sessions
// arrive on an open-loop schedule at 150/s, about the rate releases free
// room. Each arrival's t0 is its intended start on the schedule, not the
// moment a submitter got to it, so a stalled submitter counts as latency
// (no coordinated omission). The queue depth is sampled through the run:
// its minimum says whether the cluster stayed saturated.
func BenchmarkPlacementLatencySaturated(b *testing.B) { withPlacers(b, benchSaturated) }

func benchSaturated(b *testing.B, placers int) {
	const (
		nodes    = 100
		rate     = 150  // arrivals per second
		arrivals = 1500 // sampled sessions: 10 s of arrivals
		backlog  = 150  // queued beyond what fills the cluster
		workers  = 32   // concurrent submitters (API replicas)
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	endpoint, cli, s := benchCluster(b, nodes)
	rng := rand.New(rand.NewSource(11))

	// Release every bound session after 1–3 s, as its agent would.
	agentsCtx, stopAgents := context.WithCancel(ctx)
	defer stopAgents()
	var release sync.WaitGroup
	var boundAt sync.Map
	var holdMu sync.Mutex
	hold := rand.New(rand.NewSource(13))
	boundWatch(b, ctx, cli, s.k, func(bd state.Binding, rev int64) {
		boundAt.LoadOrStore(bd.Session, time.Now())
		holdMu.Lock()
		d := time.Second + time.Duration(hold.Int63n(int64(2*time.Second)))
		holdMu.Unlock()
		release.Add(1)
		go func() {
			defer release.Done()
			select {
			case <-agentsCtx.Done():
				return
			case <-time.After(d):
			}
			_ = state.Release(agentsCtx, cli, s.k, bd.Node, bd.Session, rev, nil)
		}()
	})

	// The first queue: enough to fill every GPU, and a backlog behind it.
	var first []int
	for gpus := 0; gpus < nodes*8; {
		g := benchSizes(rng, 1)[0]
		first = append(first, g)
		gpus += g
	}
	first = append(first, benchSizes(rng, backlog)...)
	submitAll(b, ctx, s, first, 64, nil)
	ps := startPlacers(b, endpoint, placers, Config{})
	for _, p := range ps {
		<-p.Ready()
	}

	// Queue depth, sampled every 100 ms while sessions arrive.
	var depthMin, depthSum, depthN atomic.Int64
	depthMin.Store(int64(len(first)))
	sampleCtx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-sampleCtx.Done():
				return
			case <-t.C:
			}
			resp, err := cli.Get(sampleCtx, s.k.PendingDir(), clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				continue // cancelled at the end
			}
			n := resp.Count
			if n < depthMin.Load() {
				depthMin.Store(n)
			}
			depthSum.Add(n)
			depthN.Add(1)
		}
	}()

	// Open loop: arrival i is due at start + i/rate, whatever happened to
	// the ones before it; its t0 is that due time.
	sizes := benchSizes(rng, arrivals)
	type arrival struct {
		size int
		due  time.Time
	}
	ch := make(chan arrival, arrivals)
	var at sync.Map
	var subs sync.WaitGroup
	for w := 0; w < workers; w++ {
		subs.Add(1)
		go func() {
			defer subs.Done()
			for a := range ch {
				ids := s.submit(ctx, fmt.Sprintf("user%d", a.size), []int{a.size}, nil)
				at.Store(ids[0], a.due)
			}
		}()
	}
	start := time.Now()
	for i, g := range sizes {
		due := start.Add(time.Duration(i) * time.Second / rate)
		time.Sleep(time.Until(due))
		ch <- arrival{size: g, due: due}
	}
	close(ch)
	subs.Wait()
	stopSampling()
	<-sampled
	eventually(b, 2*time.Minute, "every arrival bound", func() bool {
		n := 0
		at.Range(func(id, _ any) bool {
			if _, ok := boundAt.Load(id); ok {
				n++
			}
			return true
		})
		return n == arrivals
	})
	stopAgents()
	release.Wait()

	var lat []time.Duration
	at.Range(func(id, t0 any) bool {
		t1, _ := boundAt.Load(id)
		lat = append(lat, t1.(time.Time).Sub(t0.(time.Time)))
		return true
	})
	meanDepth := float64(depthSum.Load()) / float64(max(depthN.Load(), 1))
	st := sumStats(ps)
	saturated := "queue never emptied"
	if depthMin.Load() == 0 {
		saturated = "QUEUE EMPTIED: not saturated throughout"
	}
	p50, p99, p999 := reportLatency(b, lat, fmt.Sprintf("at saturation, %d placer(s), %d samples, %s", placers, len(lat), saturated))
	b.ReportMetric(float64(depthMin.Load()), "min-queue")
	b.ReportMetric(meanDepth, "mean-queue")
	b.ReportMetric(float64(st.Conflicts)/float64(max(st.Bound, 1)), "conflicts/binding")
	b.Logf("%d placers, cluster full, %d sessions arriving at %d/s (open loop, t0 = intended start): pending→bound p50 %s p99 %s p99.9 %s over %d samples; queue depth min %d mean %.0f (%s); %d txns, %d conflicts",
		placers, arrivals, rate, p50.Round(time.Millisecond), p99.Round(time.Millisecond), p999.Round(time.Millisecond), len(lat),
		depthMin.Load(), meanDepth, saturated, st.Txns, st.Conflicts)
}

// reportLatency sorts lat and reports its p50, p99 and p99.9 as metrics
// and as summary rows named "pending->bound pNN " + figure.
func reportLatency(b *testing.B, lat []time.Duration, figure string) (p50, p99, p999 time.Duration) {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	for _, r := range []struct {
		name string
		q    float64
		d    *time.Duration
	}{{"p50", 0.50, &p50}, {"p99", 0.99, &p99}, {"p99.9", 0.999, &p999}} {
		*r.d = lat[min(int(r.q*float64(len(lat))), len(lat)-1)]
		ms := float64(r.d.Microseconds()) / 1000
		b.ReportMetric(ms, r.name+"-ms")
		benchsum.Add(b, benchsum.Row{Figure: "pending->bound " + r.name + " " + figure, Value: ms, Unit: "ms"})
	}
	return p50, p99, p999
}
