package placer

import (
	"fmt"
	"math/rand"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/benchsum"
	"github.com/voyager-gpu/voyager/state"
)

// kindBacklog is a pass of a cluster some of whose nodes offer another
// kind of device than whole GPUs: nodes 8-GPU nodes, the first special of
// them shared (every GPU in fractions) or, with mig, every GPU split into
// two 1g.10gb MIG devices. A first plan of filled requests of that kind
// (eight owners' fractions of 10, 20 or 40 GiB; five owners' requests of
// one or two MIG devices) fills the special nodes, and whole-GPU sessions
// of two owners the others; then queued requests of that kind wait, aged
// 0 to 60 minutes, some of them fitting what is left and most not, and
// with mig a whole-GPU request beside every third.
func kindBacklog(nodes, special, filled, queued int, mig bool) *Snapshot {
	rng := rand.New(rand.NewSource(35))
	s := &Snapshot{Now: t0.Add(-2 * time.Hour)}
	for i := 0; i < nodes; i++ {
		n := gpuNode(fmt.Sprintf("node%05d", i), 8, "NVIDIA A100-SXM4-80GB")
		if i < special {
			if mig {
				for g := range n.GPUs {
					n = split(n, g)
				}
			} else {
				n = shareNode(n, 0, 1, 2, 3, 4, 5, 6, 7)
			}
		}
		s.Nodes = append(s.Nodes, view(n))
	}
	mibs := []int64{10240, 20480, 40960}
	ofKind := func(id string, i int, age time.Duration) Pending {
		if mig {
			p := req(id, fmt.Sprintf("mig%d", i%5), 1+rng.Intn(2), age)
			p.Entry.Request.MIGProfile = "1g.10gb"
			return p
		}
		p := req(id, fmt.Sprintf("nb%d", i%8), 1, age)
		p.Entry.Request.GPUShareMiB = mibs[rng.Intn(len(mibs))]
		return p
	}
	for i := 0; i < filled; i++ {
		s.Pending = append(s.Pending, ofKind(fmt.Sprintf("run-kind%06d", i), i, 0))
	}
	for i, g := range benchSizes(rng, (nodes-special)*8/3+nodes) {
		s.Pending = append(s.Pending, req(fmt.Sprintf("run%06d", i), fmt.Sprintf("user%d", i%2), g, 0))
	}
	full := filledSnapshot(s, NewPlan(s, PlanOptions{}))
	full.Now = t0
	full.Pending = nil
	for i := 0; i < queued; i++ {
		age := time.Duration(rng.Intn(3600)) * time.Second
		p := ofKind(fmt.Sprintf("q%06d", i), i, age)
		p.Revision = int64(len(full.Pending) + 1)
		full.Pending = append(full.Pending, p)
		if mig && i%3 == 0 {
			w := req(fmt.Sprintf("w%06d", i), fmt.Sprintf("user%d", i%2), 1+rng.Intn(8), age)
			w.Revision = int64(len(full.Pending) + 1)
			full.Pending = append(full.Pending, w)
		}
	}
	return full
}

// asWholeGPUs is s with every queued request asking for one whole GPU
// instead of a fraction or MIG devices (its copy; s is unchanged): the
// same queue, searched through the buckets of whole GPUs.
func asWholeGPUs(s *Snapshot) *Snapshot {
	c := *s
	c.Pending = make([]Pending, len(s.Pending))
	for i, p := range s.Pending {
		e := *p.Entry
		if e.Request.Fraction() || e.Request.MIGProfile != "" {
			e.Request = state.Resources{GPUs: 1, CPUMilli: e.Request.CPUMilli, MemoryMiB: e.Request.MemoryMiB}
		}
		p.Entry = &e
		c.Pending[i] = p
	}
	c.Cache = NewPlanCache()
	return &c
}

// BenchmarkNewPlanDeviceKinds is the cost of one pass at 2,000 nodes
// where 2,500 requests for fractions of shared GPUs wait (500 nodes
// shared), and one where 2,500 requests for MIG devices wait beside 834
// whole-GPU ones (500 nodes split), at the default settings with a warm
// PlanCache. Such requests cannot use the buckets of free whole GPUs that
// whole-GPU searches walk: each search reads the nodes in order, so its
// cost is in how many nodes it reads and what each costs. The ceiling of
// each, measured in the same run with the passes interleaved, is the same
// queue asking for one whole GPU per request (asWholeGPUs). It reports
// p50 and p99 of the CPU time over at least 30 passes of each to the
// bench summary, with the load average in the log.
func BenchmarkNewPlanDeviceKinds(b *testing.B) {
	opt := PlanOptions{ReserveAfter: 10 * time.Minute}
	type run struct {
		name      string
		s, whole  *Snapshot
		cpu, ceil []time.Duration
	}
	runs := []*run{
		{name: "2,500 fractions queued, 500 of 2,000 nodes shared", s: kindBacklog(2000, 500, 500*8*3+1000, 2500, false)},
		{name: "2,500 MIG requests queued, 500 of 2,000 nodes split", s: kindBacklog(2000, 500, 500*9, 2500, true)},
	}
	pass := func(s *Snapshot) time.Duration {
		c0 := benchsum.ProcessCPU(b)
		p := NewPlan(s, opt)
		cpu := benchsum.ProcessCPU(b) - c0
		if len(p.Bound)+len(p.Waiting) != len(s.Pending) {
			b.Fatalf("%d bound and %d waiting of %d queued", len(p.Bound), len(p.Waiting), len(s.Pending))
		}
		return cpu
	}
	for _, r := range runs {
		r.s.Cache = NewPlanCache()
		r.whole = asWholeGPUs(r.s)
		first := NewPlan(r.s, opt)
		bound := 0
		for _, d := range first.Bound {
			if d.Pending.Entry.Request.Fraction() || d.Pending.Entry.Request.MIGProfile != "" {
				bound++
			}
		}
		b.Logf("%s: one pass binds %d of that kind and %d in all, %d waiting", r.name, bound, len(first.Bound), len(first.Waiting))
		if bound == 0 || bound*2 > len(r.s.Pending) {
			b.Fatalf("%s: %d of %d bound: the pass must both place some and search for most", r.name, bound, len(r.s.Pending))
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N || len(runs[0].cpu) < 30; i++ {
		for _, r := range runs {
			r.cpu = append(r.cpu, pass(r.s))
			b.StopTimer()
			r.ceil = append(r.ceil, pass(r.whole))
			b.StartTimer()
		}
	}
	b.StopTimer()
	q := benchsum.QuantileMS
	load := "unknown"
	if l, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = strings.Join(strings.Fields(string(l))[:3], " ")
	}
	const ceiling = "same queue, a whole GPU per request"
	for _, r := range runs {
		b.Logf("%s: %d passes; CPU p50/p99 %.1f/%.1f ms (whole GPUs %.1f/%.1f); load average %s",
			r.name, len(r.cpu), q(r.cpu, 0.5), q(r.cpu, 0.99), q(r.ceil, 0.5), q(r.ceil, 0.99), load)
		benchsum.Add(b, benchsum.Row{Figure: "NewPlan " + r.name + ": CPU p50", Value: q(r.cpu, 0.50), Unit: "ms", Ceiling: q(r.ceil, 0.50), CeilingName: ceiling})
		benchsum.Add(b, benchsum.Row{Figure: "NewPlan " + r.name + ": CPU p99", Value: q(r.cpu, 0.99), Unit: "ms", Ceiling: q(r.ceil, 0.99), CeilingName: ceiling})
	}
	b.ReportMetric(q(runs[0].cpu, 0.99), "frac-cpu-p99-ms")
	b.ReportMetric(q(runs[1].cpu, 0.99), "mig-cpu-p99-ms")
}
