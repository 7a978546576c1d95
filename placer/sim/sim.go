package sim

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
)

// Size is one request shape of a stream's mix: GPUs on the head (or
// single) part and, for a Ray gang, Workers more parts of the same GPUs,
// each on its own node. Share is its relative frequency in the mix.
type Size struct {
	GPUs    int
	Workers int
	Share   float64
	// ShareMiB, when set, makes the shape a fraction of one shared GPU
	// of that much memory (a notebook; GPUs is ignored): it binds only
	// on Config.SharedNodes' GPUs.
	ShareMiB int64
	// Name, when set, is the shape's label in reports (shapes of one
	// name share their waits).
	Name string
}

// Label names the shape in reports: "8" for one 8-GPU part, "gang 3×8" for
// a head and two workers of 8 GPUs each.
func (s Size) Label() string {
	if s.Name != "" {
		return s.Name
	}
	if s.ShareMiB > 0 {
		return fmt.Sprintf("frac %dG", s.ShareMiB>>10)
	}
	if s.Workers == 0 {
		return fmt.Sprint(s.GPUs)
	}
	return fmt.Sprintf("gang %d×%d", s.Workers+1, s.GPUs)
}

// DefaultMix is 1-, 2-, 4- and 8-GPU sessions at 40, 30, 20 and 10 %.
var DefaultMix = []Size{{GPUs: 1, Share: 0.4}, {GPUs: 2, Share: 0.3}, {GPUs: 4, Share: 0.2}, {GPUs: 8, Share: 0.1}}

// RuntimeKind is the distribution of a session's run time.
type RuntimeKind string

const (
	// Exponential run times (memoryless), the default.
	Exponential RuntimeKind = "exponential"
	// Fixed run times: every session runs exactly Mean.
	Fixed RuntimeKind = "fixed"
	// LogNormal run times with shape Sigma: many short, a long tail.
	LogNormal RuntimeKind = "lognormal"
)

// Runtime is a run-time distribution with mean Mean.
type Runtime struct {
	Kind  RuntimeKind
	Mean  time.Duration
	Sigma float64 // LogNormal only; zero means 1
}

func (r Runtime) draw(rng *rand.Rand) time.Duration {
	mean := float64(r.Mean)
	switch r.Kind {
	case Fixed:
		return r.Mean
	case LogNormal:
		s := r.Sigma
		if s == 0 {
			s = 1
		}
		mu := math.Log(mean) - s*s/2 // so that the mean is Mean
		return time.Duration(math.Exp(mu + s*rng.NormFloat64()))
	default:
		return time.Duration(rng.ExpFloat64() * mean)
	}
}

// Stream is one source of sessions: Poisson arrivals at Rate per hour
// between Start and End (End zero: the whole run), each bringing Burst
// sessions at once (zero means one), of shapes drawn from Sizes (empty:
// DefaultMix) and run times drawn from Runtime. With RampTo above zero the
// rate rises (or falls) linearly from Rate at Start to RampTo at End.
// Each session declares a max runtime (state.QueueEntry.MaxRuntime) the
// way people pick one: the first of 15 min, 30 min, 1, 2, 4, 8, 24, 72 h
// and multiples of 72 h that its run time does not exceed (up to twice
// the run time); NoLimit sessions declare none, as most notebooks.
type Stream struct {
	NoLimit bool
	User    string
	Groups  []string
	Rate    float64
	RampTo  float64
	Start   time.Duration
	End     time.Duration
	Burst   int
	Sizes   []Size
	Runtime Runtime

	// Team is the team the sessions are charged to (Config.Teams), and
	// Preemptible marks them preemptible (Config.Preempt).
	Team        string
	Preemptible bool
}

// Config is one simulation: the cluster, the placer's options, the
// workload and what to measure.
type Config struct {
	// Nodes of GPUsPerNode GPUs each (8 if zero); the first SharedNodes
	// of them offer every GPU in fractions (state.GPU.Shared).
	Nodes       int
	GPUsPerNode int
	SharedNodes int
	// NodeGPUs, when set, is each node's GPUs by index (len Nodes), for a
	// cluster of machines of several sizes; GPUsPerNode is then ignored.
	NodeGPUs []int
	// Plan is given to placer.NewPlan on every pass.
	Plan placer.PlanOptions
	// Streams generate the sessions.
	Streams []Stream
	// Duration is how long arrivals are simulated; the run ends then,
	// sessions still waiting counted with their wait so far.
	Duration time.Duration
	// Tick is the simulated time between planning passes (default 1m);
	// a wait is measured from arrival to the pass that binds it.
	Tick time.Duration
	// Seed makes the run reproducible.
	Seed uint64
	// From and To bound the window in which fairness, shares, utilisation
	// and idle capacity are measured (To zero: Duration).
	From, To time.Duration
	// UserWeights and GroupWeights are the admins' fair-share weights,
	// given to the planner as quotas' Weight.
	UserWeights  map[string]float64
	GroupWeights map[string]float64
	// PowerDownAfter is how long a node must have held nothing to count in
	// Result.IdleNodes (default 30 minutes, VOYAGER_NODE_POWER_DOWN_AFTER's).
	PowerDownAfter time.Duration
	// Record keeps every session's start and nodes in Result.Schedule,
	// for the optimiser to measure the run against (optimum.go).
	Record bool
	// Teams is the team tree the planner is given (placer.Snapshot.Teams).
	Teams []state.Team
	// Preempt, when set, plans preemptions after every pass as the
	// lifecycle controller does (teams.go).
	Preempt *Preempt
	// Trace, if set, gets every pass in the window that left work
	// waiting, after its binds started: what the run's figures are
	// computed from, to find the cause of a figure (simsuite -trace).
	Trace func(Pass)
	// DeclaredLimit, if set, is the max runtime every session that
	// declares one declares, whatever it runs for (one longer runs to
	// its end): a workload whose max runtimes tell the planner nothing,
	// as where everyone asks for the most allowed (simsuite -declare).
	DeclaredLimit time.Duration
	// NoEstimates gives the planner no run times learned from history
	// (placer.Snapshot.Runtimes nil): every node drains by its max
	// runtimes alone. Otherwise each session that ends is added to its
	// user's state.RuntimeRecord, as the usage accountant adds a finished
	// attempt (state.LearnRuntimes), and every pass sees the records.
	NoEstimates bool
}

// Pass is one planning pass as Config.Trace sees it.
type Pass struct {
	// Now is the simulated time since the start.
	Now time.Duration
	// Held and Waiting are each user's GPUs allocated and asked for by
	// its waiting requests; Fair is each waiting user's demand-capped
	// weighted share (what Jain's index divides by); all three in
	// thousandths of a GPU, as fractions count.
	Held, Waiting map[string]int
	Fair          map[string]float64
	// Jain is the pass's index over users with waiting work (1 when
	// fewer than two wait).
	Jain float64
	// Free is the GPUs free, Slots8 the nodes with 8 free, Reserved the
	// nodes held for a waiting request and HeldFree their free GPUs.
	Free, Slots8, Reserved, HeldFree int
	// Plan is the pass's plan (read only).
	Plan *placer.Plan
	// Drains is, for every node of at least 8 GPUs, how long until the
	// last session now on it ends by its true run time (0 for an empty
	// node), ascending: the k-th is the soonest k such nodes could be
	// empty to a policy that knew every run time and stopped nothing (a
	// bound on how soon waiting 8-GPU requests can start).
	Drains []time.Duration
}

// Stats summarises the queueing times of one request shape, in minutes.
type Stats struct {
	N              int
	Mean, P50, P99 float64
	Max            float64
	StillWaits     int // of N, still waiting at the end
}

// Result is what one run measured.
type Result struct {
	// Jain is the mean, and JainMin the least, over passes in the window
	// with at least two users waiting, of Jain's index over those users'
	// GPUs held, each divided by the user's fair share: the weighted
	// max-min (water-filling) division of the cluster's GPUs over every
	// user's demand (GPUs held plus GPUs waiting). 1 is perfectly fair,
	// 1/n one user holding all. Dividing by the demand-capped share rather
	// than the weight alone keeps a user who asks for less than an equal
	// share (one 8-GPU request waiting beside one running) from counting
	// as treated unfairly for holding less than the others.
	Jain, JainMin float64
	// Share is each user's mean fraction of the cluster's GPUs held over
	// the window.
	Share map[string]float64
	// Wait is the queueing time by shape (Size.Label), and UserWait each
	// user's by shape: who waited, where Wait says only how long.
	Wait     map[string]Stats
	UserWait map[string]map[string]Stats
	// Util is the mean fraction of GPUs allocated over passes in the
	// window that left work waiting; IdleHeld and IdleFragmented split the
	// rest: free GPUs on nodes held for a waiting request, and elsewhere.
	Util, IdleHeld, IdleFragmented float64
	// Busy is the mean fraction of GPUs allocated over passes in the
	// window whose waiting requests together asked for at least the GPUs
	// free: the moments at which the queue could have filled the cluster
	// ("busy while work waits").
	Busy float64
	// LongestRuntime is the longest run time drawn for any session.
	LongestRuntime time.Duration
	// MaxExcess is the most, in minutes, that any request waited beyond
	// the wait its fair share implied at its arrival: the GPU-minutes its
	// user had queued before it over the GPUs the user's demand-capped
	// weighted share gave it then.
	MaxExcess float64
	// QueuedFraction is the fraction of passes in the window that left
	// work waiting.
	QueuedFraction float64
	// Slots8 is the mean number of nodes with 8 GPUs free, and Floor8 the
	// mean of floor(free GPUs / 8), over passes that left work waiting.
	Slots8, Floor8 float64
	// Tick is the run's time between passes (Config.Tick): the resolution
	// of every wait.
	Tick time.Duration
	// Sessions arrived; Passes planned; PlanP50 and PlanP99 the wall time
	// of one NewPlan call.
	Sessions, Passes int
	PlanP50, PlanP99 time.Duration
	// Sharing is what fractions of shared GPUs did (share.go).
	Sharing Sharing
	// Teams is what each team held over the run (Config.Teams).
	Teams map[string]*TeamResult
	// Preempted counts the sessions stopped by preemption, and
	// PreemptedGPUHours the GPU-hours of work they lost.
	Preempted         int
	PreemptedGPUHours float64
	// ActiveNodes is the mean, over passes in the window, of nodes that
	// hold at least one session: the machines that could not be powered
	// down. IdleNodes is the mean of nodes that have held nothing for at
	// least Config.PowerDownAfter (30 minutes if zero): those an operator
	// could have powered down.
	ActiveNodes, IdleNodes float64
	// Schedule is every session in arrival order with the pass that bound
	// it, when Config.Record is set.
	Schedule []Placed
}

// Placed is one session of a recorded run: what it asked for, when it
// arrived, and where and at which pass the planner bound it.
type Placed struct {
	ID, User string
	// GPUs on each part, and Parts: 1, or a Ray head and its workers.
	GPUs, Parts int
	Arrive      time.Duration
	Runtime     time.Duration
	// Limit is the max runtime it declared (zero: none), all the planner
	// knows of its run time.
	Limit time.Duration
	// Pass is the index of the pass that bound it (its start is Pass ×
	// Tick); -1 if it still waited at the end.
	Pass int
	// Nodes are the indices of the nodes its parts were bound to.
	Nodes []int
	// FairWait is the wait, in minutes, its user's fair share implied at
	// its arrival (Result.MaxExcess).
	FairWait float64
}

// userShape keys the waits of one user's requests of one shape.
type userShape struct{ user, label string }

// waitStats summarises waits (minutes) by shape and by user and shape,
// still counting those still waiting at the end.
func waitStats(waits map[userShape][]float64, still map[userShape]int) (map[string]Stats, map[string]map[string]Stats) {
	byShape, stillByShape := map[string][]float64{}, map[string]int{}
	byUser := map[string]map[string]Stats{}
	for k, w := range waits {
		byShape[k.label] = append(byShape[k.label], w...)
		stillByShape[k.label] += still[k]
		if byUser[k.user] == nil {
			byUser[k.user] = map[string]Stats{}
		}
		byUser[k.user][k.label] = statsOf(w, still[k])
	}
	out := make(map[string]Stats, len(byShape))
	for label, w := range byShape {
		out[label] = statsOf(w, stillByShape[label])
	}
	return out, byUser
}

// statsOf is the Stats of waits w (minutes, at least one; sorted in
// place), still of which still waited at the end.
func statsOf(w []float64, still int) Stats {
	sort.Float64s(w)
	sum := 0.0
	for _, x := range w {
		sum += x
	}
	return Stats{N: len(w), Mean: sum / float64(len(w)), P50: quantile(w, 0.5), P99: quantile(w, 0.99),
		Max: w[len(w)-1], StillWaits: still}
}

type session struct {
	id      string
	user    string
	groups  []string
	size    Size
	arrive  time.Duration
	runtime time.Duration
	limit   time.Duration // declared max runtime; zero: none
	// team and preemptible are its stream's; gen counts its
	// preemptions: an end planned before one is stale.
	team        string
	preemptible bool
	prio        int
	gen         int
	started     time.Duration
	// fairWait is the wait, in minutes, that the user's fair share
	// implied at arrival: the GPU-minutes it queued before this request
	// over the GPUs its share gave it.
	fairWait float64
}

// startedAt is where and at which pass a recorded session was bound.
type startedAt struct {
	pass  int
	nodes []int
}

type running struct {
	end   time.Duration
	id    string
	nodes []string
	gen   int
}

type endHeap []running

func (h endHeap) Len() int { return len(h) }
func (h endHeap) Less(i, j int) bool {
	if h[i].end != h[j].end {
		return h[i].end < h[j].end
	}
	return h[i].id < h[j].id
}
func (h endHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *endHeap) Push(x any)   { *h = append(*h, x.(running)) }
func (h *endHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// epoch is the simulated wall clock at time zero.
var epoch = time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC)

// arrivals draws every session of every stream, in arrival order.
func arrivals(cfg *Config, rng *rand.Rand) []session {
	var out []session
	for si, st := range cfg.Streams {
		end := st.End
		if end == 0 || end > cfg.Duration {
			end = cfg.Duration
		}
		sizes := st.Sizes
		if len(sizes) == 0 {
			sizes = DefaultMix
		}
		total := 0.0
		for _, s := range sizes {
			total += s.Share
		}
		burst := max(st.Burst, 1)
		peak := max(st.Rate, st.RampTo)
		if peak <= 0 {
			continue
		}
		t := st.Start
		for n := 0; ; n++ {
			t += time.Duration(rng.ExpFloat64() / peak * float64(time.Hour))
			if t >= end {
				break
			}
			if st.RampTo > 0 {
				// Thinning: arrivals drawn at the peak rate, each kept
				// with the rate at its time over the peak.
				rate := st.Rate + (st.RampTo-st.Rate)*float64(t-st.Start)/float64(end-st.Start)
				if rng.Float64()*peak >= rate {
					continue
				}
			}
			for b := 0; b < burst; b++ {
				x := rng.Float64() * total
				size := sizes[len(sizes)-1]
				for _, s := range sizes {
					if x < s.Share {
						size = s
						break
					}
					x -= s.Share
				}
				s := session{id: fmt.Sprintf("s%d-%06d-%d", si, n, b), user: st.User, groups: st.Groups,
					size: size, arrive: t, runtime: st.Runtime.draw(rng), team: st.Team, preemptible: st.Preemptible}
				switch {
				case st.NoLimit:
				case cfg.DeclaredLimit > 0:
					s.limit = max(cfg.DeclaredLimit, s.runtime)
				default:
					s.limit = limitFor(s.runtime)
				}
				out = append(out, s)
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].arrive != out[j].arrive {
			return out[i].arrive < out[j].arrive
		}
		return out[i].id < out[j].id
	})
	return out
}

func gpuNode(i, gpus int, shared bool) state.Node {
	name := fmt.Sprintf("node-%04d", i)
	n := state.Node{Name: name, CPUMilli: int64(gpus) * 16000, MemoryMiB: int64(gpus) << 17, Ports: state.PortRange{First: 40000, Last: 40999}}
	for g := 0; g < gpus; g++ {
		n.GPUs = append(n.GPUs, state.GPU{Index: g, UUID: fmt.Sprintf("GPU-%s-%d", name, g), Model: "A100", MemoryMiB: 81920,
			NUMANode: g * 2 / max(gpus, 1), Healthy: true, Shared: shared})
	}
	return n
}

// nodeGPUs is how many GPUs node i has.
func (cfg *Config) nodeGPUs(i int) int {
	if cfg.NodeGPUs != nil {
		return cfg.NodeGPUs[i]
	}
	if cfg.GPUsPerNode <= 0 {
		return 8
	}
	return cfg.GPUsPerNode
}

// totalGPUs is how many GPUs the cluster has.
func (cfg *Config) totalGPUs() int {
	t := 0
	for i := range cfg.Nodes {
		t += cfg.nodeGPUs(i)
	}
	return t
}

// Run simulates cfg and reports what it measured.
func Run(cfg Config) Result {
	if cfg.GPUsPerNode <= 0 {
		cfg.GPUsPerNode = 8
	}
	if cfg.NodeGPUs != nil && len(cfg.NodeGPUs) != cfg.Nodes {
		panic(fmt.Sprintf("sim: Config.NodeGPUs has %d nodes, Config.Nodes %d", len(cfg.NodeGPUs), cfg.Nodes))
	}
	if cfg.Tick <= 0 {
		cfg.Tick = time.Minute
	}
	if cfg.To == 0 {
		cfg.To = cfg.Duration
	}
	if cfg.PowerDownAfter <= 0 {
		cfg.PowerDownAfter = 30 * time.Minute
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x766f7961676572)) // "voyager"
	arr := arrivals(&cfg, rng)
	bySession := make(map[string]*session, len(arr))
	for i := range arr {
		bySession[arr[i].id] = &arr[i]
	}

	views := make([]placer.NodeView, cfg.Nodes)
	index := map[string]int{}
	for i := range views {
		n := gpuNode(i, cfg.nodeGPUs(i), i < cfg.SharedNodes)
		views[i] = placer.NodeView{Node: n, NodeRevision: 1, Ledger: state.Ledger{Node: n.Name, Allocations: map[string]state.Allocation{}}}
		index[n.Name] = i
	}
	// Held, waiting and capacity count thousandths of a GPU, as the
	// placer's fair share does: a fraction counts its share of a GPU.
	capacity := cfg.totalGPUs() * 1000
	// The placer's own case: node state kept between passes, rebuilt where
	// a ledger's revision moved (it changes no plan).
	cache := placer.NewPlanCache()
	users, groups := map[string]state.Quota{}, map[string]state.Quota{}
	for u, w := range cfg.UserWeights {
		users[u] = state.Quota{Weight: &w}
	}
	for g, w := range cfg.GroupWeights {
		groups[g] = state.Quota{Weight: &w}
	}
	weight := func(u string) float64 {
		if w, ok := cfg.UserWeights[u]; ok && w > 0 {
			return w
		}
		return 1
	}

	tm := newTeamSim(&cfg)
	var (
		res      = Result{Share: map[string]float64{}, Wait: map[string]Stats{}, Sessions: len(arr), Tick: cfg.Tick}
		pending  []placer.Pending
		ends     endHeap
		held     = map[string]int{}          // thousandths of GPUs held, by user
		waits    = map[userShape][]float64{} // minutes
		still    = map[userShape]int{}
		planDur  []time.Duration
		next     int
		jainN    int
		busyN    int
		window   int
		queued   int
		shareSum = map[string]float64{}
		waitGPUs = map[string]int{}     // thousandths of GPUs waiting, by user
		backlog  = map[string]float64{} // GPU-minutes waiting (thousandths), by user
		share    = newShareMeter()
		active   float64
		idle     float64
		lastBusy = make([]time.Duration, cfg.Nodes) // when each node last held something; set below
		started  = map[string]startedAt{}
		runtimes map[string]*state.RuntimeRecord // by user; nil: NoEstimates
	)
	if !cfg.NoEstimates {
		runtimes = map[string]*state.RuntimeRecord{}
	}
	for i := range lastBusy {
		lastBusy[i] = -cfg.PowerDownAfter // empty since before the run: may power down at once
	}
	for now := time.Duration(0); now < cfg.Duration; now += cfg.Tick {
		for len(ends) > 0 && ends[0].end <= now {
			r := heap.Pop(&ends).(running)
			s := bySession[r.id]
			if r.gen != s.gen {
				continue // preempted since: its end is void
			}
			for _, n := range r.nodes {
				delete(views[index[n]].Ledger.Allocations, r.id)
				views[index[n]].LedgerRevision++
			}
			held[s.user] -= s.size.milli()
			if runtimes != nil {
				learn(runtimes, s, r.end)
			}
		}
		first := next
		for next < len(arr) && arr[next].arrive <= now {
			s := &arr[next]
			next++
			created := epoch.Add(s.arrive)
			e := state.QueueEntry{Session: s.id, Kind: state.KindBatch, Owner: s.user, Groups: s.groups, Team: s.team, Preemptible: s.preemptible, Created: created, Enqueued: created,
				Request:    state.Resources{GPUs: s.size.GPUs, CPUMilli: int64(s.size.GPUs) * 1000, MemoryMiB: int64(s.size.GPUs) << 13},
				MaxRuntime: state.Duration(s.limit)}
			if s.size.ShareMiB > 0 {
				e.Kind, e.Request = state.KindNotebook, state.Resources{GPUs: 1, GPUShareMiB: s.size.ShareMiB, CPUMilli: 1000, MemoryMiB: 8192}
			}
			if s.size.Workers > 0 {
				e.Workers = s.size.Workers
			}
			if !tm.admit(s, &e) {
				continue // refused: over its team's budget (teams.go)
			}
			pending = append(pending, placer.Pending{Entry: &e, Revision: 1})
			waitGPUs[s.user] += s.size.milli()
			tm.arrived(s, views, pending)
		}
		if first < next {
			// The wait each new request's fair share implies: the work
			// its user queued before it, at the GPUs the user's
			// demand-capped weighted share gives it now.
			fair := fairShares(capacity, held, waitGPUs, weight)
			for i := first; i < next; i++ {
				s := &arr[i]
				g := float64(s.size.milli())
				s.fairWait = backlog[s.user] / fair[s.user]
				backlog[s.user] += g * s.runtime.Minutes()
			}
		}
		pending = tm.stopVictims(now, views, index, pending, held, waitGPUs, bySession)
		snap := &placer.Snapshot{Nodes: views, Pending: pending, UserQuotas: users, GroupQuotas: groups, Now: epoch.Add(now), Cache: cache,
			Teams: tm.tree(), Held: tm.heldNodes(pending, now), Preempting: tm.preempting(), Runtimes: runtimes}
		start := time.Now()
		plan := placer.NewPlan(snap, cfg.Plan)
		planDur = append(planDur, time.Since(start))
		res.Passes++
		bound := make(map[string]bool, len(plan.Bound))
		for _, d := range plan.Bound {
			s := bySession[d.Pending.Entry.Session]
			bound[s.id] = true
			r := running{end: now + s.runtime, id: s.id, gen: s.gen}
			s.started = now
			for _, pp := range d.Parts {
				v := &views[index[pp.Node]]
				v.Ledger.Allocations[s.id] = state.Allocation{Kind: d.Pending.Entry.Kind, Owner: s.user, Groups: s.groups, Role: pp.Role,
					GPUs: pp.Devices, CPUMilli: pp.CPUMilli, MemoryMiB: pp.MemoryMiB, Ports: pp.Ports, Ends: pp.Ends, Expects: pp.Expects,
					Queued: d.Pending.Entry.Created, Team: s.team, Preemptible: s.preemptible, Priority: s.prio,
					Share: d.Pending.Entry.Request.Share(sharedGPUMiB)}
				v.LedgerRevision++
				r.nodes = append(r.nodes, pp.Node)
			}
			heap.Push(&ends, r)
			if cfg.Record {
				nodes := make([]int, len(r.nodes))
				for i, n := range r.nodes {
					nodes[i] = index[n]
				}
				started[s.id] = startedAt{pass: res.Passes - 1, nodes: nodes}
			}
			held[s.user] += s.size.milli()
			waitGPUs[s.user] -= s.size.milli()
			backlog[s.user] -= float64(s.size.milli()) * s.runtime.Minutes()
			k := userShape{s.user, s.size.Label()}
			waits[k] = append(waits[k], (now - s.arrive).Minutes())
			tm.bound(s, now)
			res.MaxExcess = max(res.MaxExcess, (now-s.arrive).Minutes()-s.fairWait)
		}
		if len(bound) > 0 {
			// A new slice: the plan's decisions and waiting sessions
			// point into the snapshot's, which preemption reads after.
			kept := make([]placer.Pending, 0, len(pending)-len(bound))
			for _, p := range pending {
				if !bound[p.Entry.Session] {
					kept = append(kept, p)
				}
			}
			pending = kept
		}
		tm.pass(now, snap, plan, views, pending, bySession, &res)
		for i := range views {
			if len(views[i].Ledger.Allocations) > 0 {
				lastBusy[i] = now
			}
		}
		if now < cfg.From || now >= cfg.To {
			continue
		}
		window++
		share.pass(views, len(ends))
		for i := range views {
			if len(views[i].Ledger.Allocations) > 0 {
				active++
			} else if now-lastBusy[i] >= cfg.PowerDownAfter {
				idle++
			}
		}
		used := 0
		for u, g := range held {
			shareSum[u] += float64(g) / float64(capacity)
			used += g
		}
		if len(pending) == 0 {
			continue
		}
		queued++
		res.Util += float64(used) / float64(capacity)
		waitingGPUs := map[string]int{}
		wantGPUs := 0
		for u, g := range waitGPUs {
			if g > 0 {
				waitingGPUs[u] = g
				wantGPUs += g
			}
		}
		if wantGPUs >= capacity-used {
			res.Busy += float64(used) / float64(capacity)
			busyN++
		}
		slots, free, heldFree := 0, 0, 0
		for _, v := range views {
			f := len(v.Node.GPUs) - gpusInUse(&v.Ledger)
			free += f
			if f >= 8 {
				slots++
			}
			if _, ok := plan.Reserved[v.Node.Name]; ok {
				heldFree += f
				res.IdleHeld += float64(f*1000) / float64(capacity)
			} else {
				res.IdleFragmented += float64(f*1000) / float64(capacity)
			}
		}
		res.Slots8 += float64(slots)
		res.Floor8 += float64(free / 8)
		j, fair := 1.0, map[string]float64(nil)
		if len(waitingGPUs) >= 2 {
			fair = fairShares(capacity, held, waitingGPUs, weight)
			var sum, sq float64
			for u := range waitingGPUs {
				x := float64(held[u]) / fair[u]
				sum += x
				sq += x * x
			}
			if sq > 0 {
				j = sum * sum / (float64(len(waitingGPUs)) * sq)
			}
			res.Jain += j
			if jainN == 0 || j < res.JainMin {
				res.JainMin = j
			}
			jainN++
		}
		if cfg.Trace != nil {
			pass := Pass{Now: now, Held: map[string]int{}, Waiting: waitingGPUs, Fair: fair, Jain: j, Free: free, Slots8: slots, Reserved: len(plan.Reserved), HeldFree: heldFree, Plan: plan}
			for u, g := range held {
				pass.Held[u] = g
			}
			last := make(map[string]time.Duration, len(views))
			for _, r := range ends {
				for _, n := range r.nodes {
					last[n] = max(last[n], r.end-now)
				}
			}
			for i := range views {
				if len(views[i].Node.GPUs) >= 8 {
					pass.Drains = append(pass.Drains, last[views[i].Node.Name])
				}
			}
			slices.Sort(pass.Drains)
			cfg.Trace(pass)
		}
	}
	for _, p := range pending {
		s := bySession[p.Entry.Session]
		k := userShape{s.user, s.size.Label()}
		waits[k] = append(waits[k], (cfg.Duration - s.arrive).Minutes())
		res.MaxExcess = max(res.MaxExcess, (cfg.Duration-s.arrive).Minutes()-s.fairWait)
		still[k]++
	}
	res.Wait, res.UserWait = waitStats(waits, still)
	for i := range arr {
		res.LongestRuntime = max(res.LongestRuntime, arr[i].runtime)
	}
	if jainN > 0 {
		res.Jain /= float64(jainN)
	} else {
		res.Jain, res.JainMin = 1, 1
	}
	res.Sharing = share.result()
	if busyN > 0 {
		res.Busy /= float64(busyN)
	} else {
		res.Busy = 1
	}
	if window > 0 {
		for u, s := range shareSum {
			res.Share[u] = s / float64(window)
		}
		res.QueuedFraction = float64(queued) / float64(window)
		res.ActiveNodes = active / float64(window)
		res.IdleNodes = idle / float64(window)
	}
	if queued > 0 {
		res.Util /= float64(queued)
		res.IdleHeld /= float64(queued)
		res.IdleFragmented /= float64(queued)
		res.Slots8 /= float64(queued)
		res.Floor8 /= float64(queued)
	}
	if cfg.Record {
		res.Schedule = make([]Placed, len(arr))
		for i := range arr {
			s := &arr[i]
			p := Placed{ID: s.id, User: s.user, GPUs: s.size.GPUs, Parts: s.size.Workers + 1, Arrive: s.arrive, Runtime: s.runtime, Limit: s.limit, Pass: -1, FairWait: s.fairWait}
			if st, ok := started[s.id]; ok {
				p.Pass, p.Nodes = st.pass, st.nodes
			}
			res.Schedule[i] = p
		}
	}
	sort.Slice(planDur, func(i, j int) bool { return planDur[i] < planDur[j] })
	if len(planDur) > 0 {
		res.PlanP50 = planDur[len(planDur)/2]
		res.PlanP99 = planDur[min(len(planDur)-1, len(planDur)*99/100)]
	}
	return res
}

// quantile is the q-quantile of sorted xs (nearest rank).
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[max(0, min(i, len(xs)-1))]
}

// fairShares is each waiting user's weighted max-min share of capacity
// GPUs given every user's demand (held plus waiting): water-filling, each
// user capped at its demand, the rest divided again by weight. Only the
// users of waiting are returned; each share is above zero.
func fairShares(capacity int, held, waiting map[string]int, weight func(string) float64) map[string]float64 {
	type claim struct {
		user   string
		demand float64
		w      float64
	}
	var cs []claim
	seen := map[string]bool{}
	for u, g := range held {
		if g > 0 || waiting[u] > 0 {
			cs = append(cs, claim{u, float64(g + waiting[u]), weight(u)})
			seen[u] = true
		}
	}
	for u, g := range waiting {
		if !seen[u] {
			cs = append(cs, claim{u, float64(g), weight(u)})
		}
	}
	// Users in order of demand per weight: each takes the lesser of its
	// demand and its weight's part of what is left.
	sort.Slice(cs, func(i, j int) bool {
		a, b := cs[i].demand/cs[i].w, cs[j].demand/cs[j].w
		if a != b {
			return a < b
		}
		return cs[i].user < cs[j].user
	})
	left, wsum := float64(capacity), 0.0
	for _, c := range cs {
		wsum += c.w
	}
	out := make(map[string]float64, len(waiting))
	for _, c := range cs {
		give := min(c.demand, left*c.w/wsum)
		left -= give
		wsum -= c.w
		if _, ok := waiting[c.user]; ok {
			out[c.user] = max(give, 1e-9)
		}
	}
	return out
}

// limitLadder is the max runtimes people pick from.
var limitLadder = []time.Duration{15 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour, 4 * time.Hour, 8 * time.Hour, 24 * time.Hour, 72 * time.Hour}

// limitFor is the max runtime a session of run time run declares: the
// first rung of limitLadder at least run, or the multiple of 72 h above it.
func limitFor(run time.Duration) time.Duration {
	for _, l := range limitLadder {
		if run <= l {
			return l
		}
	}
	step := limitLadder[len(limitLadder)-1]
	return (run + step - 1) / step * step
}

// learn adds session s, ended at end, to its user's run times, as the
// usage accountant adds a finished attempt: the GPUs of every part
// together, from its bind to its end.
func learn(runtimes map[string]*state.RuntimeRecord, s *session, end time.Duration) {
	rec := runtimes[s.user]
	if rec == nil {
		rec = &state.RuntimeRecord{Owner: s.user}
		runtimes[s.user] = rec
	}
	gpus := s.size.GPUs * (1 + s.size.Workers)
	if s.size.ShareMiB > 0 {
		gpus = 1
	}
	rec.Add(state.RuntimeSample{Session: s.id, QueueRevision: int64(s.gen) + 1, GPUs: gpus,
		Seconds: int64((end - s.started) / time.Second), Declared: int64(s.limit / time.Second), Ended: epoch.Add(end)})
}
