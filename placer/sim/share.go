package sim

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
)

// Fractions of shared GPUs in the simulator (issue 35): Config.SharedNodes
// of the cluster's nodes offer their GPUs in fractions of memory, and a
// Size with ShareMiB asks for one. The placer packs fractions onto shared
// GPUs; the simulator checks at every pass of the window that no shared
// GPU holds more memory than it has, fractions of two owners or a whole
// allocation beside a fraction (Sharing.Violations), and measures how many
// sessions the cluster holds and how tightly fractions pack.

// sharedGPUMiB is the memory of every simulated GPU (gpuNode).
const sharedGPUMiB = 81920

// Sharing is what one run measured of sharing, over the window.
type Sharing struct {
	// Running is the mean number of sessions running at a pass.
	Running float64
	// PerGPU is the mean number of fractions on a shared GPU that holds
	// any; Fill the mean share of such a GPU's memory its fractions hold.
	PerGPU, Fill float64
	// Violations counts (pass, GPU) pairs that broke a rule of shared
	// GPUs: fractions over the GPU's memory, fractions of two owners, or
	// a whole allocation beside a fraction. The placer must keep it 0.
	Violations int
	// FirstViolation says the first one, for the report.
	FirstViolation string
}

// milli is what a session of shape s holds in thousandths of a GPU: 1000
// per GPU of every part, or a fraction's share of a simulated GPU.
func (s Size) milli() int {
	if s.ShareMiB > 0 {
		return int(state.GPUShare{MemoryMiB: s.ShareMiB, GPUMemoryMiB: sharedGPUMiB}.MilliGPUs())
	}
	return 1000 * s.GPUs * (s.Workers + 1)
}

// gpusInUse is the number of physical GPUs of l that hold anything: a
// shared GPU with fractions counts once, and is no free GPU.
func gpusInUse(l *state.Ledger) int {
	n, fractions := 0, map[string]bool{}
	for _, a := range l.Allocations {
		if a.Share == nil {
			n += len(a.GPUs)
			continue
		}
		for _, u := range a.GPUs {
			fractions[u] = true
		}
	}
	return n + len(fractions)
}

// shareMeter sums Sharing over the passes of the window.
type shareMeter struct {
	passes, gpus      int
	running, per, fil float64
	res               Sharing
}

func newShareMeter() *shareMeter { return &shareMeter{} }

// pass measures the views at one pass with running sessions running, and
// checks every shared GPU's rules.
func (m *shareMeter) pass(views []placer.NodeView, running int) {
	m.passes++
	m.running += float64(running)
	for i := range views {
		v := &views[i]
		whole := map[string]string{}
		for id, a := range v.Ledger.Allocations {
			if a.Share == nil {
				for _, u := range a.GPUs {
					whole[u] = id
				}
			}
		}
		fr := v.Ledger.Fractions()
		gpus := make([]string, 0, len(fr))
		for u := range fr {
			gpus = append(gpus, u)
		}
		sort.Strings(gpus)
		for _, u := range gpus {
			s := fr[u]
			count := 0
			for _, a := range v.Ledger.Allocations {
				if a.Share != nil && len(a.GPUs) == 1 && a.GPUs[0] == u {
					count++
				}
			}
			m.gpus++
			m.per += float64(count)
			m.fil += float64(s.MemoryMiB) / sharedGPUMiB
			var bad string
			switch {
			case s.MemoryMiB > sharedGPUMiB:
				bad = fmt.Sprintf("fractions of %s hold %d MiB of %d", u, s.MemoryMiB, sharedGPUMiB)
			case len(s.Owners) > 1:
				bad = fmt.Sprintf("shared GPU %s holds fractions of %d owners", u, len(s.Owners))
			case whole[u] != "":
				bad = fmt.Sprintf("%s holds %s whole beside its fractions", whole[u], u)
			}
			if bad != "" {
				if m.res.Violations == 0 {
					m.res.FirstViolation = bad
				}
				m.res.Violations++
			}
		}
	}
}

func (m *shareMeter) result() Sharing {
	r := m.res
	if m.passes > 0 {
		r.Running = m.running / float64(m.passes)
	}
	if m.gpus > 0 {
		r.PerGPU, r.Fill = m.per/float64(m.gpus), m.fil/float64(m.gpus)
	}
	return r
}

// NotebookMix is the fractions notebooks ask for: 10, 20 and 40 GiB of an
// 80 GiB GPU at 40, 40 and 20 % (a mean of 20 GiB, a quarter GPU).
// Their waits are reported together, as "notebook".
var NotebookMix = []Size{{ShareMiB: 10 << 10, Share: 0.4, Name: "notebook"}, {ShareMiB: 20 << 10, Share: 0.4, Name: "notebook"}, {ShareMiB: 40 << 10, Share: 0.2, Name: "notebook"}}

// notebookUsers is how many researchers the notebooks come from: a
// shared GPU holds one owner's fractions at a time, so the owners matter.
const notebookUsers = 8

// ShareSuite is issue 35's workload at a cluster of nodes 8-GPU nodes
// (hours as in Suite): researchers' notebooks asking for fractions
// (NotebookMix, log-normal run times of mean 2 h, no max runtime) beside
// whole-GPU training (two users, DefaultMix, 60% of the cluster), with a
// quarter of the nodes shared; and its control, the very same arrivals
// with every notebook asking for a whole GPU on a cluster without shared
// GPUs. The pair shows how many more sessions sharing lets the cluster
// hold and what it does to the training's waits.
func ShareSuite(nodes int, hours float64) []Shape {
	d := time.Duration(24 * hours * float64(time.Hour)).Round(SuiteTick)
	shared := max(1, nodes/4)
	// Notebooks offer 60% of the shared GPUs' memory.
	nbRate := rate(shared, 0.6, meanMilli(NotebookMix)/1000, 2*time.Hour) / notebookUsers
	build := func(fractions bool) func(placer.PlanOptions, uint64) Config {
		return func(o placer.PlanOptions, seed uint64) Config {
			c := Config{Nodes: nodes, Plan: o, Duration: d, Tick: SuiteTick, Seed: seed, From: d / 6,
				Streams: []Stream{steady("u0", nodes, 0.3), steady("u1", nodes, 0.3)}}
			mix := NotebookMix
			if fractions {
				c.SharedNodes = shared
			} else {
				mix = make([]Size, len(NotebookMix))
				for i, s := range NotebookMix {
					mix[i] = Size{GPUs: 1, Share: s.Share, Name: s.Name}
				}
			}
			for u := range notebookUsers {
				c.Streams = append(c.Streams, Stream{User: fmt.Sprintf("nb%d", u), Rate: nbRate, Sizes: mix, NoLimit: true,
					Runtime: Runtime{Kind: LogNormal, Mean: 2 * time.Hour}})
			}
			return c
		}
	}
	shapes := []Shape{
		{Name: "frac-notebooks", About: "8 researchers' notebooks in fractions of 10/20/40 GiB (60% of the shared GPUs' memory) on a quarter of the nodes shared, beside two users' whole-GPU training (60%)", Build: build(true)},
		{Name: "frac-notebooks-whole", About: "control: the same arrivals, each notebook asking for a whole GPU, no GPU shared", Build: build(false)},
	}
	for i := range shapes {
		shapes[i].Nodes = nodes
	}
	return shapes
}

// meanMilli is the mean thousandths of a GPU of a session drawn from mix.
func meanMilli(mix []Size) float64 {
	m, t := 0.0, 0.0
	for _, s := range mix {
		m += float64(s.milli()) * s.Share
		t += s.Share
	}
	return m / t
}

// ShareTable writes the sharing figures of rows as a Markdown table: per
// run, the sessions that arrived, the mean running, the fractions per
// shared GPU in use and its memory filled, the p50/p99 waits of
// notebooks (fractions or their whole-GPU stand-ins) and of 8-GPU
// training, and the violations of shared GPUs' rules found.
func ShareTable(rows []SuiteRow) string {
	var b strings.Builder
	b.WriteString("| nodes | shape | strategy | seed | sessions | running (mean) | fractions per shared GPU / memory filled | notebook wait p50 / p99 (min) | 8-GPU wait p50 / p99 (min) | violations |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, row := range rows {
		r := row.Result
		nb := r.Wait["notebook"]
		per := "–"
		if r.Sharing.PerGPU > 0 {
			per = fmt.Sprintf("%.2f / %.0f%%", r.Sharing.PerGPU, 100*r.Sharing.Fill)
		}
		viol := fmt.Sprint(r.Sharing.Violations)
		if r.Sharing.Violations > 0 {
			viol += " (" + r.Sharing.FirstViolation + ")"
		}
		eight := r.Wait["8"]
		fmt.Fprintf(&b, "| %d | %s | %s | %d | %d | %.1f | %s | %.0f / %.0f | %.0f / %.0f | %s |\n",
			row.Shape.Nodes, row.Shape.Name, row.Strategy, row.Seed, r.Sessions, r.Sharing.Running, per,
			nb.P50, nb.P99, eight.P50, eight.P99, viol)
	}
	return b.String()
}
