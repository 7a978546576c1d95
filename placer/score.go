package placer

import (
	"hash/fnv"
	"sort"

	"github.com/voyager-gpu/voyager/state"
)

// Strategy is how the placer spreads load across nodes.
type Strategy string

// Strategies.
const (
	// Binpack fills the fullest node that fits first, keeping whole
	// machines free for 8-GPU requests. The default.
	Binpack Strategy = "binpack"
	// Spread places on the emptiest node that fits, for even load.
	Spread Strategy = "spread"
	// Pack (pack.go) packs new work onto the fewest machines.
)

// Score weights. The strategy score decides; locality breaks near-ties in
// favour of GPUs that talk over NVLink or share a NUMA node.
const (
	weightStrategy = 1.0
	weightLocality = 0.5
)

// scorer is one named, weighted score in [0, 1] for placing part p on
// node n with devices devs.
type scorer struct {
	name   string
	weight float64
	score  func(p *part, n *nodeState, devs []int) float64
}

// scorers builds the chain: the strategy's score (binpack, spread or
// pack), then locality. Exactly
// two, which the planner relies on to keep per-candidate scores off the heap.
func scorers(s Strategy) []scorer {
	first := scorer{"binpack", weightStrategy, scoreBinpack}
	switch s {
	case Spread:
		first = scorer{"spread", weightStrategy, func(p *part, n *nodeState, devs []int) float64 { return 1 - scoreBinpack(p, n, devs) }}
	case Pack:
		first = scorer{"pack", weightStrategy, scorePack}
	}
	return []scorer{first, {"locality", weightLocality, scoreLocality}}
}

// scoreBinpack is how full the node is after the placement: GPUs for GPU
// requests, the chosen shared GPU's memory for a fraction, CPU for
// CPU-only ones.
func scoreBinpack(p *part, n *nodeState, devs []int) float64 {
	if p.req.Fraction() {
		return shareFull(p, n, devs)
	}
	if p.req.GPUs > 0 && n.totalGPU > 0 {
		return float64(n.usedGPU+p.req.GPUs) / float64(n.totalGPU)
	}
	if n.view.Node.CPUMilli == 0 {
		return 0
	}
	used := n.view.Node.CPUMilli - n.freeCPU + p.req.CPUMilli
	return float64(used) / float64(n.view.Node.CPUMilli)
}

// scoreLocality is 1 when every chosen GPU reaches every other over NVLink,
// 0.5 when they share a NUMA node, 0 otherwise (and 1 for fewer than two).
func scoreLocality(_ *part, n *nodeState, devs []int) float64 {
	if len(devs) < 2 {
		return 1
	}
	nvlink, numa := true, true
	for i, a := range devs {
		for _, b := range devs[i+1:] {
			da, db := &n.devices[a], &n.devices[b]
			if da.numa != db.numa {
				numa = false
			}
			if !n.linked(da, db) {
				nvlink = false
			}
		}
	}
	switch {
	case nvlink:
		return 1
	case numa:
		return 0.5
	}
	return 0
}

// chooseDevices picks count free devices matching r, preferring a set that
// stays within one NUMA node (the fullest such node, to keep others whole)
// and, inside it, GPUs joined by NVLink to the first pick.
func chooseDevices(n *nodeState, r *state.Resources) []int {
	return chooseDevicesInto(n, r, nil)
}

// chooseDevicesInto is chooseDevices writing its answer into dst's array
// where it has room (dst is resliced from 0): a search that scores a
// dozen candidates keeps only the best one's devices.
func chooseDevicesInto(n *nodeState, r *state.Resources, dst []int) []int {
	if r.GPUs == 0 {
		return nil
	}
	// Free matching devices, in index order; count them per NUMA node.
	// The working lists live on the stack for nodes of up to stackDevices
	// devices: this runs for every node a request is scored on, and only
	// its answer is kept.
	var freeBuf, poolBuf, orderBuf [stackDevices]int
	free := freeBuf[:0]
	var perNUMA [8]int // NUMA ids beyond 7 share the last slot: still correct, less precise
	for i := range n.devices {
		if n.taken[i] || !deviceMatches(&n.devices[i], r) {
			continue
		}
		free = append(free, i)
		perNUMA[numaSlot(n.devices[i].numa)]++
	}
	best := -1
	for d, c := range perNUMA {
		if c >= r.GPUs && (best < 0 || c < perNUMA[best]) {
			best = d
		}
	}
	pool := free
	if best >= 0 {
		pool = poolBuf[:0]
		for _, i := range free {
			if numaSlot(n.devices[i].numa) == best {
				pool = append(pool, i)
			}
		}
	}
	if len(pool) < r.GPUs {
		return nil
	}
	// Greedy NVLink clique: start at the first device, prefer its peers,
	// then the rest in index order.
	first := pool[0]
	order := append(orderBuf[:0], first)
	for _, i := range pool[1:] {
		if n.nvlink[n.devices[first].gpu*n.gpus+n.devices[i].gpu] {
			order = append(order, i)
		}
	}
	for _, i := range pool[1:] {
		if len(order) == r.GPUs {
			break
		}
		if !n.nvlink[n.devices[first].gpu*n.gpus+n.devices[i].gpu] {
			order = append(order, i)
		}
	}
	chosen := append(dst[:0], order[:r.GPUs]...)
	sort.Ints(chosen)
	return chosen
}

// stackDevices is how many devices chooseDevices works on without
// allocating (more still work: its lists then grow on the heap).
const stackDevices = 32

func numaSlot(numa int) int {
	if numa < 0 {
		return 0
	}
	return min(numa, 7)
}

// tieBreak orders equally scored nodes per session: deterministic, so every
// placer computes the same plan, yet different for each session, so equal
// nodes share the load (Nomad seeds its node shuffle the same way).
func tieBreak(session, node string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(session))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(node))
	return h.Sum64()
}
