package placer

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"

	"github.com/voyager-gpu/voyager/state"
)

// GPU fractions in the planner (state/share.go has the model): a shared
// GPU is one device of its node whose memory fractions fill. It is never
// taken whole; a fraction fits it while the memory its fractions hold
// leaves room and they all belong to the fraction's owner (a classic MPS
// control daemon serves one user at a time, nodeagent/mps.go). Fractions
// pack: within a node onto the shared GPU with the least room that holds
// them, across nodes by how full that GPU ends (scoreBinpack), so empty
// shared GPUs stay empty for larger fractions.

// shareUse is what the fractions of one shared device hold.
type shareUse struct {
	usedMiB int64
	owners  map[string]int // owner → fractions
}

// cloneShares makes n's shares its own before a pass changes them: the
// PlanCache's template keeps its copy.
func (n *nodeState) cloneShares() {
	if n.shares == nil {
		return
	}
	s := make([]shareUse, len(n.shares))
	for i, u := range n.shares {
		s[i] = shareUse{usedMiB: u.usedMiB, owners: maps.Clone(u.owners)}
	}
	n.shares = s
}

// shareTake counts fraction a (sign +1) or stops counting it (-1) on its
// GPU. Where the node lists that physical GPU otherwise than shared (whole,
// or split into MIG devices, after the node registered again), a's
// fraction takes every device of it instead (devices are physical first).
func (n *nodeState) shareTake(a *state.Allocation, sign int) {
	for _, u := range a.GPUs {
		p := a.Parent(u, nil)
		for i := range n.devices {
			d := &n.devices[i]
			if d.parent != p {
				continue
			}
			if !d.shared {
				if sign > 0 && !n.taken[i] {
					n.taken[i] = true
				}
				continue
			}
			s := &n.shares[i]
			s.usedMiB += int64(sign) * a.Share.MemoryMiB
			if s.owners == nil {
				s.owners = map[string]int{}
			}
			s.owners[a.Owner] += sign
			if s.owners[a.Owner] <= 0 {
				delete(s.owners, a.Owner)
			}
		}
	}
}

// roomFor reports whether device i has room for r: always for anything
// but a fraction; for a fraction, room in its memory and no fraction of
// another owner than owner ("": any owner's fractions count as none).
func (n *nodeState) roomFor(i int, r *state.Resources, owner string) bool {
	if !r.Fraction() {
		return true
	}
	if n.shares == nil || !n.devices[i].shared {
		return false
	}
	s := &n.shares[i]
	if n.devices[i].memoryMiB-s.usedMiB < r.GPUShareMiB {
		return false
	}
	if owner == "" || len(s.owners) == 0 {
		return true
	}
	return len(s.owners) == 1 && s.owners[owner] > 0
}

// shareRoom reports whether fraction a's GPU still has room for it.
func (n *nodeState) shareRoom(a *state.Allocation) bool {
	r := state.Resources{GPUShareMiB: a.Share.MemoryMiB}
	for _, u := range a.GPUs {
		ok := false
		for i := range n.devices {
			if n.devices[i].uuid == u && !n.taken[i] && n.roomFor(i, &r, a.Owner) {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// choosePart picks the devices of part p on n: chooseDevices, or for a
// fraction chooseShare.
func choosePart(n *nodeState, p *part) []int {
	return choosePartInto(n, p, nil)
}

// choosePartInto is choosePart writing its answer into dst's array where
// it has room (chooseDevicesInto).
func choosePartInto(n *nodeState, p *part, dst []int) []int {
	if p.req.Fraction() {
		if i := chooseShare(n, p); i >= 0 {
			return append(dst[:0], i)
		}
		return nil
	}
	return chooseDevicesInto(n, p.req, dst)
}

// chooseShare picks the shared GPU of n that p's fraction fits with the
// least room left (best fit: fractions pack, empty GPUs stay empty): its
// device's index, or -1 if none fits.
func chooseShare(n *nodeState, p *part) int {
	best, left := -1, int64(0)
	for i := range n.devices {
		d := &n.devices[i]
		if n.taken[i] || !deviceMatches(d, p.req) || !n.roomFor(i, p.req, p.owner) {
			continue
		}
		l := d.memoryMiB - n.shares[i].usedMiB - p.req.GPUShareMiB
		if best < 0 || l < left {
			best, left = i, l
		}
	}
	return best
}

// shareFull is how full the shared GPU devs[0] of n ends with p's
// fraction on it: the binpack score of a fraction.
func shareFull(p *part, n *nodeState, devs []int) float64 {
	if len(devs) == 0 || n.shares == nil {
		return 0
	}
	d := &n.devices[devs[0]]
	if d.memoryMiB <= 0 {
		return 0
	}
	return float64(n.shares[devs[0]].usedMiB+p.req.GPUShareMiB) / float64(d.memoryMiB)
}

// filterShare is filterGPUs for a fraction: a shared GPU with room for it
// among this owner's or no one's fractions.
func filterShare(p *part, n *nodeState) *Shortfall {
	fits, others, most := shareScan(p, n)
	if fits {
		return nil
	}
	msg := fmt.Sprintf("node %s has no shared GPU that fits %d MiB", n.name, p.req.GPUShareMiB)
	switch {
	case others:
		msg = fmt.Sprintf("node %s's shared GPUs with %d MiB free hold other users' fractions (one user per shared GPU at a time)", n.name, p.req.GPUShareMiB)
	case most >= 0:
		msg = fmt.Sprintf("node %s's shared GPUs have at most %d MiB free, needs %d MiB", n.name, most, p.req.GPUShareMiB)
	}
	return &Shortfall{Filter: "share", Requested: p.req.GPUShareMiB, Free: max(most, 0), Message: msg}
}

// shareScan reads n's devices for fraction p: whether a shared GPU has
// room for it among its owner's or no one's fractions (fits); if none
// has, whether one would but for another owner's fractions (others), and
// the most memory free on a matching one (most, -1 if none matches).
func shareScan(p *part, n *nodeState) (fits, others bool, most int64) {
	most = -1
	if n.lacksKind(p.req) {
		return false, false, most
	}
	for i := range n.devices {
		d := &n.devices[i]
		if n.taken[i] || !deviceMatches(d, p.req) {
			continue
		}
		if n.roomFor(i, p.req, p.owner) {
			return true, false, most
		}
		if n.roomFor(i, p.req, "") {
			others = true
			continue
		}
		most = max(most, d.memoryMiB-n.shares[i].usedMiB)
	}
	return false, others, most
}

// refitShare is refit's check of fraction a of session id on n's ledger l
// (held indexes l): one shared GPU, excluded by no whole or MIG holder of
// it, with room for a's memory beside its other fractions, all of a's
// owner. It records the GPU's memory in a.Share.
func refitShare(n *state.Node, l *state.Ledger, held *state.Holdings, id string, a *state.Allocation) error {
	if len(a.GPUs) != 1 {
		return fmt.Errorf("a fraction holds one GPU, not %d", len(a.GPUs))
	}
	u := a.GPUs[0]
	var gpu *state.GPU
	for i := range n.GPUs {
		if n.GPUs[i].UUID == u {
			gpu = &n.GPUs[i]
		}
	}
	if gpu == nil || !gpu.Shared {
		return fmt.Errorf("device %s is not a shared GPU of %s", u, n.Name)
	}
	if others := held.FractionExcluders(u, id); len(others) > 0 {
		return fmt.Errorf("GPU %s of %s is held whole or in MIG devices by session %s", u, n.Name, others[0])
	}
	if used := held.FractionMiB(u, id); used+a.Share.MemoryMiB > gpu.MemoryMiB {
		return fmt.Errorf("shared GPU %s of %s has %d of %d MiB free, needs %d", u, n.Name, gpu.MemoryMiB-used, gpu.MemoryMiB, a.Share.MemoryMiB)
	}
	for o := range l.Fractions()[u].Owners {
		if o != a.Owner {
			return fmt.Errorf("shared GPU %s of %s holds fractions of %s (one user per shared GPU at a time)", u, n.Name, o)
		}
	}
	share := *a.Share
	share.GPUMemoryMiB = gpu.MemoryMiB
	a.Share = &share
	return nil
}

// partShare is the fraction that the part of e with role asks for; nil
// for anything but a fraction. Its GPU's memory is filled in by refit.
func partShare(e *state.QueueEntry, role state.Role) *state.GPUShare {
	r := &e.Request
	if role == state.RoleWorker && e.WorkerRequest != nil {
		r = e.WorkerRequest
	}
	return r.Share(0)
}

// milliGPUs is what request r counts as in fair share and quotas, in
// thousandths of a GPU: 1000 a device; a fraction its share of a GPU of
// refMiB (the largest shared GPU of the cluster: the exact share is known
// once it is bound, Allocation.MilliGPUs), or its compute percent where
// larger.
func milliGPUs(r *state.Resources, refMiB int64) int64 {
	if r.Fraction() {
		return r.Share(refMiB).MilliGPUs()
	}
	return 1000 * int64(r.GPUs)
}

// sharedRefMiB is the memory of the largest shared GPU of nodes (0: none).
func sharedRefMiB(nodes []*nodeState) int64 {
	var ref int64
	for _, n := range nodes {
		if n.shares == nil {
			continue
		}
		for i := range n.devices {
			if n.devices[i].shared {
				ref = max(ref, n.devices[i].memoryMiB)
			}
		}
	}
	return ref
}

// describeShare says what fraction r asks for.
func describeShare(r *state.Resources) string {
	model := "GPU"
	if r.GPUModel != "" {
		model = r.GPUModel
	}
	s := fmt.Sprintf("a %d MiB fraction of a shared %s", r.GPUShareMiB, model)
	if r.GPUComputePercent > 0 {
		s += fmt.Sprintf(" (%d%% compute)", r.GPUComputePercent)
	}
	return s
}

// scaled writes v thousandths (scale 1000) or units (scale 1) as a
// number of units: "2", "0.25".
func scaled(v, scale int64) string {
	if v%scale == 0 {
		return fmt.Sprint(v / scale)
	}
	return strconv.FormatFloat(float64(v)/float64(scale), 'f', -1, 64)
}

// shareShape is what a fraction adds to a request's shape: interchangeable
// fractions ask for as much of a GPU, for one owner (a shared GPU holds
// one owner's fractions, so where one owner's fraction found no room
// another's may).
type shareShape struct {
	mib     int64
	compute int
	owner   string
}

func shareShapeOf(pt *part) shareShape {
	if !pt.req.Fraction() {
		return shareShape{}
	}
	return shareShape{pt.req.GPUShareMiB, pt.req.GPUComputePercent, pt.owner}
}

// chooseShareVictims is chooseVictims for fraction p on node n (the node
// as its ledger stands, victims still there): on each shared GPU p may
// use, every fraction of another owner than p's must go (one owner per
// shared GPU), and of p's owner's, the largest allowed ones until the
// GPU's memory holds p; then, where CPU, memory or ports still fall short,
// other candidates of the node in cands' order, until fits holds. Unneeded
// victims are spared (but never another owner's on the GPU). Of the GPUs
// that work it returns the victims of the one with the fewest, then the
// lowest highest priority, then the least GPU taken; nil if none works.
func chooseShareVictims(n *nodeState, p *part, cands []Victim, fits func([]Victim) bool) []Victim {
	allowed := make(map[string]Victim, len(cands))
	for _, c := range cands {
		allowed[c.Session] = c
	}
	var best []Victim
	var bestKey [3]int64
	for i := range n.devices {
		d := &n.devices[i]
		if !d.shared || n.taken[i] || !deviceMatches(d, p.req) {
			continue
		}
		var must, mine []Victim
		free, ok := d.memoryMiB, true
		for id, a := range n.view.Ledger.Allocations {
			if a.Share == nil || !holdsDevice(&a, d.uuid) {
				continue
			}
			free -= a.Share.MemoryMiB
			c, can := allowed[id]
			switch {
			case a.Owner != p.owner && !can:
				ok = false // another owner's fraction that may not go
			case a.Owner != p.owner:
				must = append(must, c)
				free += a.Share.MemoryMiB
			case can:
				mine = append(mine, c)
			}
		}
		if !ok {
			continue
		}
		// p's owner's own fractions: the largest first, so the fewest go.
		sort.Slice(mine, func(a, b int) bool {
			x, y := mine[a].Allocation, mine[b].Allocation
			if x.Share.MemoryMiB != y.Share.MemoryMiB {
				return x.Share.MemoryMiB > y.Share.MemoryMiB
			}
			if x.Priority != y.Priority {
				return x.Priority < y.Priority
			}
			return mine[a].Session > mine[b].Session
		})
		chosen := append([]Victim(nil), must...)
		for _, c := range mine {
			if free >= p.req.GPUShareMiB {
				break
			}
			chosen = append(chosen, c)
			free += c.Allocation.Share.MemoryMiB
		}
		if free < p.req.GPUShareMiB {
			continue
		}
		keep := make(map[string]bool, len(must))
		for _, c := range must {
			keep[c.Session] = true
		}
		// CPU, memory or ports may need more of the node's candidates.
		var rest []Victim
		for _, c := range cands {
			if !slices.ContainsFunc(chosen, func(v Victim) bool { return v.Session == c.Session }) {
				rest = append(rest, c)
			}
		}
		chosen = takeUntilFits(chosen, rest, keep, fits)
		if chosen == nil {
			continue
		}
		key := [3]int64{int64(len(chosen)), -1 << 31, 0}
		for _, c := range chosen {
			key[1] = max(key[1], int64(c.Allocation.Priority))
			key[2] += c.Allocation.MilliGPUs()
		}
		if best == nil || slices.Compare(key[:], bestKey[:]) < 0 {
			best, bestKey = chosen, key
		}
	}
	return best
}

// holdsDevice reports whether a holds device u.
func holdsDevice(a *state.Allocation, u string) bool {
	return slices.Contains(a.GPUs, u)
}
