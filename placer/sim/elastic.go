package sim

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
)

// Elastic jobs against fixed-size ones (issue 40). RunElastic simulates
// jobs that each have a fixed amount of work and a throughput that
// depends on their size (Amdahl's law, a parallel fraction drawn per job),
// so a job's completion time depends on the sizes it ran at; the same
// arrivals run with the elastic jobs fixed at their minimum, fixed at
// their maximum, elastic as the planner resizes them (placer.PlanElastic,
// size-blind), and elastic with goodput reports (ElasticOptions.Goodput).
// A resize is what the lifecycle controller makes of it: the job stops
// making progress at the decision, holds its GPUs for Checkpoint (its
// SIGTERM grace), is released and queued again with its cap at the new
// size, and once bound spends Restart loading its checkpoint; one job
// resizes at most once per Interval.

// ElasticMode is how a run sizes its elastic jobs.
type ElasticMode string

// The modes compared.
const (
	// FixedMin: every elastic job is a fixed-size job of its minimum.
	FixedMin ElasticMode = "fixed-min"
	// FixedMax: every elastic job is a fixed-size job of its maximum.
	FixedMax ElasticMode = "fixed-max"
	// SizeBlind: elastic, resized by PlanElastic without goodput reports.
	SizeBlind ElasticMode = "elastic"
	// GoodputAware: elastic, each job reporting its goodput at the sizes it
	// ran at, PlanElastic with ElasticOptions.Goodput.
	GoodputAware ElasticMode = "goodput"
)

// ElasticModes are the modes in the order the table shows them.
var ElasticModes = []ElasticMode{FixedMin, FixedMax, SizeBlind, GoodputAware}

// ElasticStream is a stream of elastic jobs: Stream's arrivals, its
// Runtime the time a job takes at its minimum, each asking for Min to Max
// GPUs, its parallel fraction drawn uniformly from Parallel.
type ElasticStream struct {
	Stream
	Min, Max int
	Parallel []float64
}

// ElasticCost is what a resize costs a job, and how often it may resize.
type ElasticCost struct {
	// Interval is the least time between two resizes of a job
	// (VOYAGER_ELASTIC_RESIZE_INTERVAL).
	Interval time.Duration
	// Checkpoint is the time from the resize's stop to the release of its
	// GPUs: the job checkpoints in its SIGTERM grace, making no progress.
	Checkpoint time.Duration
	// Restart is the time from the bind at the new size to progress:
	// starting again and loading the checkpoint, its GPUs held.
	Restart time.Duration
}

// DefaultElasticCost is the default rate limit (5 minutes), a 1-minute
// checkpoint and a 2-minute restart.
var DefaultElasticCost = ElasticCost{Interval: 5 * time.Minute, Checkpoint: time.Minute, Restart: 2 * time.Minute}

// ElasticConfig is one run of RunElastic.
type ElasticConfig struct {
	// Nodes of 8 GPUs each.
	Nodes int
	// Plan is given to placer.NewPlan on every pass.
	Plan placer.PlanOptions
	// Elastic streams bring the elastic jobs; Fixed streams fixed-size
	// work beside them (run times as drawn, whatever their size).
	Elastic []ElasticStream
	Fixed   []Stream
	// Duration is how long jobs arrive; the run goes on until every job
	// ended, or Drain after Duration, jobs unfinished then counted with
	// their time so far.
	Duration, Drain time.Duration
	// Tick is the simulated time between passes (default 1 minute).
	Tick time.Duration
	Seed uint64
	Mode ElasticMode
	Cost ElasticCost
	// given, when set, are the arrivals instead of the streams' draws
	// (each session's id names its stream's index: "s<i>-…").
	given []session
}

// JCT summarises job completion times, in minutes from arrival to end.
type JCT struct {
	N, Unfinished  int
	Mean, P50, P99 float64
}

// ElasticResult is what one RunElastic measured.
type ElasticResult struct {
	// Elastic is the completion time of the elastic streams' jobs, Fixed
	// that of the fixed-size streams' sessions.
	Elastic, Fixed JCT
	// Resizes counts the resizes decided; RestartGPUHours is the
	// GPU-hours held by jobs checkpointing or restarting.
	Resizes         int
	RestartGPUHours float64
	// MeanSize is the elastic jobs' mean GPUs while they ran, weighted
	// by time.
	MeanSize float64
	// Util is the mean fraction of GPUs allocated over the passes while
	// jobs arrive.
	Util float64
}

// ejob is one job of a RunElastic run.
type ejob struct {
	s        *session
	elastic  bool
	min, max int
	curve    float64 // parallel fraction
	base     float64 // samples per second at one GPU, for its reports
	// work left, in seconds of work at one GPU; rate is its speedup at
	// its size; from is when it started (or will start) progressing.
	work       float64
	size       int
	from       time.Duration
	gen        int
	resizes    int
	resized    time.Duration // last resize decided; -1: never
	cap        int           // size the last resize asked for
	stopAt     time.Duration // a resize's release; -1: none
	target     int
	node       string
	reports    map[int]float64 // goodput by size seen
	end        time.Duration
	done       bool
	sizeTime   float64 // GPU-minutes run, for MeanSize
	runMinutes float64
}

func amdahl(p float64, n int) float64 { return 1 / ((1 - p) + p/float64(n)) }

func (j *ejob) rate() float64 {
	if !j.elastic {
		return 1 // a fixed session's work is its run time
	}
	return amdahl(j.curve, j.size)
}

// RunElastic simulates cfg and reports the jobs' completion times.
func RunElastic(cfg ElasticConfig) ElasticResult {
	if cfg.Tick <= 0 {
		cfg.Tick = time.Minute
	}
	if cfg.Drain <= 0 {
		cfg.Drain = 3 * cfg.Duration
	}
	base := Config{Duration: cfg.Duration}
	kinds := make([]*ElasticStream, 0, len(cfg.Elastic)+len(cfg.Fixed))
	for i := range cfg.Elastic {
		base.Streams = append(base.Streams, cfg.Elastic[i].Stream)
		kinds = append(kinds, &cfg.Elastic[i])
	}
	for _, st := range cfg.Fixed {
		base.Streams = append(base.Streams, st)
		kinds = append(kinds, nil)
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x766f7961676572))
	arr := arrivals(&base, rng)
	if cfg.given != nil {
		arr = cfg.given
	}
	// Curves come from their own stream, so every mode sees the same.
	crng := rand.New(rand.NewPCG(cfg.Seed, 40))
	jobs := make([]*ejob, len(arr))
	byID := map[string]*ejob{}
	for i := range arr {
		s := &arr[i]
		var si int
		fmt.Sscanf(s.id, "s%d-", &si)
		j := &ejob{s: s, resized: -1, stopAt: -1}
		if k := kinds[si]; k != nil {
			j.elastic, j.min, j.max = true, k.Min, k.Max
			j.curve = k.Parallel[crng.IntN(len(k.Parallel))]
			j.base = 10 + 990*crng.Float64()
			j.work = s.runtime.Seconds() * amdahl(j.curve, k.Min)
			j.reports = map[int]float64{}
		} else {
			j.work = s.runtime.Seconds()
		}
		jobs[i], byID[s.id] = j, j
	}

	views := make([]placer.NodeView, cfg.Nodes)
	index := map[string]int{}
	for i := range views {
		n := gpuNode(i, 8, false)
		views[i] = placer.NodeView{Node: n, NodeRevision: 1, Ledger: state.Ledger{Node: n.Name, Allocations: map[string]state.Allocation{}}}
		index[n.Name] = i
	}
	cache := placer.NewPlanCache()
	var (
		res     ElasticResult
		pending []placer.Pending
		ends    endHeap
		next    int
		passes  int
		left    = len(jobs)
	)
	release := func(j *ejob) {
		v := &views[index[j.node]]
		delete(v.Ledger.Allocations, j.s.id)
		v.LedgerRevision++
		j.node = ""
	}
	queue := func(j *ejob, now time.Duration) {
		s := j.s
		created := epoch.Add(s.arrive)
		e := state.QueueEntry{Session: s.id, Kind: state.KindBatch, Owner: s.user, Created: created, Enqueued: epoch.Add(now), Attempt: j.resizes,
			Request: state.Resources{GPUs: s.size.GPUs, CPUMilli: 1000, MemoryMiB: 8192}}
		if j.elastic {
			switch cfg.Mode {
			case FixedMin:
				e.Request.GPUs = j.min
			case FixedMax:
				e.Request.GPUs = j.max
			default:
				e.Request.GPUs = j.min
				e.Elastic = &state.Elastic{Min: j.min, Max: j.max, Size: j.cap, Resizes: j.resizes}
				if j.resized >= 0 {
					at := epoch.Add(j.resized)
					e.Elastic.Resized = &at
				}
			}
		} else {
			e.MaxRuntime = state.Duration(s.limit)
		}
		e.Request.CPUMilli, e.Request.MemoryMiB = int64(e.Request.GPUs)*1000, int64(e.Request.GPUs)<<13
		pending = append(pending, placer.Pending{Entry: &e, Revision: int64(1 + j.resizes)})
	}
	// progress accrues j's work done from j.from to now at its rate.
	progress := func(j *ejob, now time.Duration) {
		if now > j.from {
			j.work -= (now - j.from).Seconds() * j.rate()
			j.from = now
		}
	}
	finish := func(j *ejob) time.Duration {
		return j.from + time.Duration(max(j.work, 0)/j.rate()*float64(time.Second))
	}
	horizon := cfg.Duration + cfg.Drain
	now := time.Duration(0)
	for ; now < horizon && left > 0; now += cfg.Tick {
		for len(ends) > 0 && ends[0].end <= now {
			r := heap.Pop(&ends).(running)
			j := byID[r.id]
			if r.gen != j.gen {
				continue
			}
			j.done, j.end = true, r.end
			j.runMinutes += (r.end - j.from).Minutes()
			j.sizeTime += float64(j.size) * (r.end - j.from).Minutes()
			release(j)
			left--
		}
		// Resizes whose checkpoint ended release their GPUs and queue
		// again at their new size.
		for _, j := range jobs {
			if j.stopAt >= 0 && j.stopAt <= now {
				j.stopAt = -1
				release(j)
				j.cap = j.target
				queue(j, now)
			}
		}
		for next < len(arr) && arr[next].arrive <= now {
			queue(jobs[next], now)
			next++
		}
		snap := &placer.Snapshot{Nodes: views, Pending: pending, Now: epoch.Add(now), Cache: cache}
		plan := placer.NewPlan(snap, cfg.Plan)
		passes++
		bound := map[string]bool{}
		for _, d := range plan.Bound {
			j := byID[d.Pending.Entry.Session]
			bound[j.s.id] = true
			pp := d.Parts[0]
			v := &views[index[pp.Node]]
			v.Ledger.Allocations[j.s.id] = state.Allocation{Kind: state.KindBatch, Owner: j.s.user, Role: pp.Role,
				GPUs: pp.Devices, CPUMilli: pp.CPUMilli, MemoryMiB: pp.MemoryMiB, Ports: pp.Ports, Ends: pp.Ends}
			v.LedgerRevision++
			j.node, j.size, j.from = pp.Node, len(pp.Devices), now
			if j.resizes > 0 && j.elastic {
				j.from = now + cfg.Cost.Restart
				res.RestartGPUHours += float64(j.size) * cfg.Cost.Restart.Hours()
			}
			j.gen++
			heap.Push(&ends, running{end: finish(j), id: j.s.id, gen: j.gen})
		}
		if len(bound) > 0 {
			kept := pending[:0]
			for _, p := range pending {
				if !bound[p.Entry.Session] {
					kept = append(kept, p)
				}
			}
			pending = kept
		}
		if cfg.Mode == SizeBlind || cfg.Mode == GoodputAware {
			res.Resizes += resizeElastic(&cfg, now, snap, plan, jobs, &res, progress)
		}
		if now < cfg.Duration {
			used := 0
			for i := range views {
				for _, a := range views[i].Ledger.Allocations {
					used += len(a.GPUs)
				}
			}
			res.Util += float64(used) / float64(8*cfg.Nodes)
		}
	}
	if passes > 0 {
		res.Util /= float64(min(passes, int(cfg.Duration/cfg.Tick)))
	}
	var el, fx []float64
	var gpuMin, runMin float64
	for _, j := range jobs {
		jct := (j.end - j.s.arrive).Minutes()
		if !j.done {
			jct = (now - j.s.arrive).Minutes()
		}
		if j.elastic {
			el = append(el, jct)
			gpuMin += j.sizeTime
			runMin += j.runMinutes
			if !j.done {
				res.Elastic.Unfinished++
			}
		} else {
			fx = append(fx, jct)
			if !j.done {
				res.Fixed.Unfinished++
			}
		}
	}
	res.Elastic = jctOf(el, res.Elastic.Unfinished)
	res.Fixed = jctOf(fx, res.Fixed.Unfinished)
	if runMin > 0 {
		res.MeanSize = gpuMin / runMin
	}
	return res
}

// resizeElastic plans the resizes of a pass as the lifecycle controller
// does (PlanElastic over the pass's snapshot and plan) and starts them:
// the job's progress stops, its release is due Checkpoint later.
func resizeElastic(cfg *ElasticConfig, now time.Duration, snap *placer.Snapshot, plan *placer.Plan, jobs []*ejob, res *ElasticResult,
	progress func(*ejob, time.Duration)) int {
	ej := map[string]placer.ElasticJob{}
	byID := map[string]*ejob{}
	for _, j := range jobs {
		if !j.elastic || j.done || j.node == "" {
			continue
		}
		byID[j.s.id] = j
		x := placer.ElasticJob{Session: j.s.id, Min: j.min, Max: j.max}
		switch {
		case j.stopAt >= 0:
			x.Target = j.target
		default:
			x.Ready = now >= j.from && (j.resized < 0 || now-j.resized >= cfg.Cost.Interval)
		}
		if cfg.Mode == GoodputAware {
			// A job that has run at its size reports it (as a job writing
			// its goodput file every few seconds would).
			if now > j.from && j.stopAt < 0 {
				j.reports[j.size] = j.base * amdahl(j.curve, j.size)
			}
			for size, g := range j.reports {
				x.Goodput = append(x.Goodput, state.GoodputSample{GoodputReport: state.GoodputReport{Size: size, SamplesPerSecond: g}, At: epoch.Add(now)})
			}
			sort.Slice(x.Goodput, func(a, b int) bool { return x.Goodput[a].Size < x.Goodput[b].Size })
		}
		ej[j.s.id] = x
	}
	n := 0
	for _, r := range placer.PlanElastic(snap, plan, ej, placer.ElasticOptions{Goodput: cfg.Mode == GoodputAware}) {
		j := byID[r.Session]
		if r.Deferred || j == nil {
			continue
		}
		ran := max(0, now-j.from).Minutes()
		j.runMinutes += ran
		j.sizeTime += float64(j.size) * ran
		progress(j, now)
		j.gen++ // its planned end is void
		j.target, j.resizes, j.resized = r.To, j.resizes+1, now
		j.stopAt = now + cfg.Cost.Checkpoint
		j.from = j.stopAt // for progress: none until it runs again
		res.RestartGPUHours += float64(j.size) * cfg.Cost.Checkpoint.Hours()
		n++
	}
	return n
}

func jctOf(xs []float64, unfinished int) JCT {
	if len(xs) == 0 {
		return JCT{}
	}
	sort.Float64s(xs)
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return JCT{N: len(xs), Unfinished: unfinished, Mean: sum / float64(len(xs)), P50: quantile(xs, 0.5), P99: quantile(xs, 0.99)}
}
