package placer

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// Pending is one queue entry as read, with the mod revision that the bind
// transaction compares against.
type Pending struct {
	// Entry is the queue entry as the cache holds it: shared with the
	// cache and every snapshot that shows it, so read only. A pointer, so
	// that a pass over 100,000 queued sessions copies none of them.
	Entry    *state.QueueEntry
	Revision int64
	// Pinned marks a session already bound in the snapshot's plan epoch
	// (Snapshot.Epoch), put back in the queue from its ledger allocations
	// (PinEpoch): the plan reserves what it holds at its turn in the
	// order, and never decides it again. Its Revision is 0.
	Pinned bool
}

// NodeView is one live node as read: its inventory (with the inventory
// key's mod revision), its ledger (with the ledger's mod revision, 0 if it
// has none yet) and its cordon, if any (with the cordon key's mod revision,
// 0 if it has none). The bind transaction compares the inventory's and the
// cordon's revisions, and the ledger's, or re-checks its choices against a
// newer ledger (refit).
type NodeView struct {
	Node           state.Node
	NodeRevision   int64
	Ledger         state.Ledger
	LedgerRevision int64
	Cordon         *state.Cordon
	CordonRevision int64
}

// Snapshot is everything one planning pass reads. Plan treats it as
// immutable.
type Snapshot struct {
	Nodes       []NodeView
	Pending     []Pending
	UserQuotas  map[string]state.Quota
	GroupQuotas map[string]state.Quota
	// QuotaRevisions holds the mod revision of each quota read, by its key
	// (state.Keys.UserQuota, GroupQuota): a bind that checked a quota
	// compares it.
	QuotaRevisions map[string]int64
	// LedgersAt is the revision the ledgers were read at: every ledger
	// write up to it is in Nodes. A bind that checked a quota requires
	// that no other placer bound for that quota after it.
	LedgersAt int64
	// Now is the pass's clock: the age of requests is measured against it.
	Now time.Time
	// Held maps nodes to the pending session that preempted sessions
	// there: while its victims stop, and after until it binds (its queue
	// entry's Hold, preempthold.go), the node's room is kept for it.
	Held map[string]string
	// Preempting maps sessions warned of a preemption to the session
	// they stop for: reclaim counts their GPUs as their preemptor's
	// team's already (reclaim.go).
	Preempting map[string]string
	// Freed is the revision of the newest change its reader saw take an
	// allocation off a ledger (a release, a preemption, a ledger deleted
	// with its node); 0 if none. Such a change leaves no newer trace in
	// the ledgers, so PinEpoch is told of it here: the plan of an epoch
	// older than it is not the plan of the state the snapshot shows.
	Freed int64
	// Epoch is the plan epoch this snapshot plans (PinEpoch): binds made
	// from its plan record it in their allocations (state.Allocation.Plan).
	Epoch int64
	// Fresh is the epoch a plan of this snapshot starts when it plans a
	// new one (PinEpoch): the newest revision it read. NewPlan starts it
	// when the epoch the snapshot plans again cannot be planned on it.
	Fresh int64
	// Teams is the team tree (teams/<name>), as read: fair share runs
	// down it and its maxima cap what teams hold (teams.go). Its
	// revisions are in QuotaRevisions by team key, for the teams with a
	// maximum: a bind checked against one compares it.
	Teams state.TeamTree
	// TeamUsage is each team's decayed GPU-hours (state.DecayedUsage,
	// its own sessions, not its sub-teams'), added to its share in the
	// order; nil: no decay (VOYAGER_PLACER_USAGE_HALF_LIFE=0).
	TeamUsage map[string]float64
	// Runtimes is each owner's recent finished run times
	// (runtimes/<owner>), from which a bind's Allocation.Expects is
	// estimated; nil: no estimates, every node drains by its max
	// runtimes alone. Like TeamUsage it is advisory: a bind does not
	// compare it, and placers that read it at different revisions may
	// plan a node's drain differently, never a GPU twice.
	Runtimes map[string]*state.RuntimeRecord
	// Cache, when set, keeps what planning derives from each node's
	// inventory and ledger between passes (see PlanCache). Set it only on
	// snapshots read from etcd, whose revisions name their contents.
	Cache *PlanCache
}

// PlanCache keeps, between one placer's passes, the state a pass derives
// from a node's inventory and ledger alone (devices, NVLink matrix, what
// the ledger holds), keyed by the node's and the ledger's mod revisions: a
// pass rebuilds only the nodes whose keys changed since the last one. At
// 10,000 nodes rebuilding every node took most of a pass that finds the
// cluster full (BenchmarkNewPlan/full). It changes no plan: the cached
// state is a function of the contents those revisions name. Safe for
// concurrent use.
type PlanCache struct {
	mu    sync.Mutex
	nodes map[string]*nodeTemplate
}

// nodeTemplate is a node's state with nothing proposed, as derived from
// the node key and ledger at the revisions it names.
type nodeTemplate struct {
	nodeRev, ledgerRev int64
	n                  nodeState
	// ends is the ledger's session ends as the last pass that read them
	// made them (drain.go); nil until one did.
	ends atomic.Pointer[ledgerEnds]
	// held is what the ledger holds by owner and group (sumHeld), made by
	// the first pass that asked; nil until one did.
	held atomic.Pointer[ledgerHeld]
}

// ledgerHeld is what a node's ledger holds, by owner and by group: what
// every pass reads of each ledger to count usage (newUsage) and an
// owner's GPUs on a node (ownGPUs), kept in the node's PlanCache template
// so that a pass adds up an owner's sum of a node instead of walking its
// ledger (at 2,000 nodes, 20,000 lookups by owner a pass). Shared
// between passes: never written once made.
type ledgerHeld struct {
	owners []ownerHeld
	groups []groupHeld
}

// ownerHeld is what one owner's allocations on a node hold: their
// devices (state.Allocation.GPUs, counted) and their usage amounts.
type ownerHeld struct {
	owner   string
	devices int
	held    amounts
}

// groupHeld is what the allocations of one group's members on a node
// hold.
type groupHeld struct {
	group string
	held  amounts
}

// sumHeld sums allocs by owner and by group, in no order that matters:
// every sum is of integers.
func sumHeld(allocs map[string]state.Allocation) *ledgerHeld {
	h := &ledgerHeld{}
	for _, a := range allocs {
		add := amounts{a.MilliGPUs(), a.CPUMilli, a.MemoryMiB}
		i := slices.IndexFunc(h.owners, func(o ownerHeld) bool { return o.owner == a.Owner })
		if i < 0 {
			i = len(h.owners)
			h.owners = append(h.owners, ownerHeld{owner: a.Owner})
		}
		h.owners[i].devices += len(a.GPUs)
		h.owners[i].held.plus(add)
		for _, g := range a.Groups {
			j := slices.IndexFunc(h.groups, func(x groupHeld) bool { return x.group == g })
			if j < 0 {
				j = len(h.groups)
				h.groups = append(h.groups, groupHeld{group: g})
			}
			h.groups[j].held.plus(add)
		}
	}
	return h
}

// ledgerSums is what n's ledger holds (sumHeld), from its PlanCache
// template, made there if no pass made it yet; nil for a node without a
// template, whose ledger the caller walks.
func (n *nodeState) ledgerSums() *ledgerHeld {
	if n.tmpl == nil {
		return nil
	}
	if h := n.tmpl.held.Load(); h != nil {
		return h
	}
	h := sumHeld(n.view.Ledger.Allocations)
	n.tmpl.held.Store(h)
	return h
}

// NewPlanCache returns an empty cache.
func NewPlanCache() *PlanCache { return &PlanCache{nodes: map[string]*nodeTemplate{}} }

// nodeStates returns the planning state of every node of s, from c's
// templates where the revisions match and built (and kept) where not, in
// into (resized; its contents overwritten).
func (c *PlanCache) nodeStates(s *Snapshot, into []nodeState) []nodeState {
	out := sized(into, len(s.Nodes))
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range s.Nodes {
		v := &s.Nodes[i]
		t, ok := c.nodes[v.Node.Name]
		if !ok || t.nodeRev != v.NodeRevision || t.ledgerRev != v.LedgerRevision {
			t = &nodeTemplate{nodeRev: v.NodeRevision, ledgerRev: v.LedgerRevision}
			initNodeState(&t.n, v)
			t.n.view = nil // the template outlives the snapshot
			c.nodes[v.Node.Name] = t
		}
		n := &out[i]
		*n = t.n
		n.view = v
		n.tmpl = t
		n.taken = slices.Clone(t.n.taken)
		n.cloneShares()
		n.portsShared = n.ports != nil
	}
	if len(c.nodes) > len(s.Nodes)+len(s.Nodes)/4+16 {
		live := make(map[string]bool, len(s.Nodes))
		for i := range s.Nodes {
			live[s.Nodes[i].Node.Name] = true
		}
		for name := range c.nodes {
			if !live[name] {
				delete(c.nodes, name)
			}
		}
	}
	return out
}

// device is one allocatable unit of a node: a whole GPU, a MIG device of
// a partitioned GPU, or a shared GPU (allocated in fractions, share.go).
type device struct {
	uuid      string
	model     string
	memoryMiB int64
	mig       string // MIG profile, "" for a whole GPU
	numa      int
	index     int // parent GPU index
	gpu       int // position of the parent GPU in the node's GPUs, by index
	healthy   bool
	// parent is the UUID of the physical GPU the device belongs to: its
	// own for a whole GPU.
	parent string
	// shared marks a shared GPU: only fractions are allocated on it.
	shared bool
}

// whole reports whether d is allocated whole: a GPU neither partitioned
// nor shared.
func (d *device) whole() bool { return d.mig == "" && !d.shared }

// nodeState is a node during one pass: what the snapshot says plus what this
// pass has proposed on it. Reserve changes it; nothing is written to etcd
// until the engine commits the plan.
type nodeState struct {
	view    *NodeView
	name    string
	devices []device
	taken   []bool // parallel to devices
	// shares is what fractions hold of each shared device (parallel to
	// devices; nil on a node without shared GPUs): share.go.
	shares []shareUse
	// migs and wholes count the MIG devices and the whole GPUs among
	// devices.
	migs, wholes int
	// nvlink[a*gpus+b] says GPU a reaches GPU b over NVLink (positions
	// as device.gpu): indexes, not UUID-keyed maps, since every pass
	// builds every node's state.
	nvlink  []bool
	gpus    int
	freeCPU int64
	freeMem int64
	ports   map[int]bool // used
	// portsShared says ports belongs to a PlanCache template: copy it
	// before changing it.
	portsShared bool
	freeGPUs    int // free healthy whole GPUs
	totalGPU    int // healthy whole GPUs + MIG devices: the node's GPU capacity
	usedGPU     int // allocated devices
	// reservedFor names the session holding this node's free capacity
	// until it fits (anti-starvation); "" when free for all.
	reservedFor string
	// reservedWhat is what reservedFor asks for, as describe writes it
	// ("4×A100"), for the reason of a request kept off the node.
	reservedWhat string
	// drainBy is when a held node's sessions have all ended by their max
	// runtimes (zero: some session has none); set with reservedFor.
	drainBy     time.Time
	bucket      int   // freeGPUs when last indexed
	pos         int   // position in its bucket
	byName      int32 // position among the pass's nodes, by name
	proposed    map[string]state.Allocation
	proposedIDs []string // in proposal order, for deterministic output
	// maxSessions caps allocations on the node (0: no cap), so that its
	// ledger, one etcd value, stays far below etcd's request limit.
	maxSessions int
	// released counts the ledger's allocations of pinned sessions that
	// the pass has freed and not yet held again.
	released int
	// ready is readyBy's memo (drain.go); tmpl is the PlanCache template
	// the state was copied from, nil without a cache.
	ready readyMemo
	tmpl  *nodeTemplate
}

// sessions counts the allocations on the node, held and proposed.
func (n *nodeState) sessions() int {
	return len(n.view.Ledger.Allocations) - n.released + len(n.proposed)
}

// release frees what the ledger allocation a holds, for a pinned session
// the plan places again at its turn (hold undoes it).
func (n *nodeState) release(a *state.Allocation) {
	if a.Share != nil {
		n.shareTake(a, -1)
		n.giveBack(a)
		n.released++
		return
	}
	for _, u := range a.GPUs {
		for i := range n.devices {
			if d := &n.devices[i]; d.uuid == u && n.taken[i] {
				n.taken[i] = false
				n.usedGPU--
				if d.healthy && d.whole() {
					n.freeGPUs++
				}
				break
			}
		}
	}
	n.giveBack(a)
	n.released++
}

// hold takes again what release freed: the devices of a that no decision
// of this pass took meanwhile, its CPU, memory and ports. free reports that
// all of it was still free; a decision took some only where the plan
// diverged from the epoch's (NewPlan then plans afresh).
func (n *nodeState) hold(a *state.Allocation) (free bool) {
	free = n.freeCPU >= a.CPUMilli && n.freeMem >= a.MemoryMiB
	for _, p := range a.Ports {
		free = free && !n.ports[p]
	}
	if a.Share != nil {
		free = free && n.shareRoom(a)
		n.shareTake(a, +1)
		n.take(a)
		n.released--
		return free
	}
	for _, u := range a.GPUs {
		for i := range n.devices {
			if d := &n.devices[i]; d.uuid == u {
				if n.taken[i] {
					free = false
					break
				}
				n.taken[i] = true
				n.usedGPU++
				if d.healthy && d.whole() {
					n.freeGPUs--
				}
				break
			}
		}
	}
	n.take(a)
	n.released--
	return free
}

func newNodeState(v *NodeView) *nodeState {
	n := &nodeState{}
	initNodeState(n, v)
	return n
}

// initNodeState sets n to node v with nothing proposed.
func initNodeState(n *nodeState, v *NodeView) {
	*n = nodeState{
		view:    v,
		name:    v.Node.Name,
		freeCPU: v.Node.CPUMilli,
		freeMem: v.Node.MemoryMiB,
	}
	gpus := v.Node.GPUs // read only; copied only to be sorted
	byIndex := func(a, b state.GPU) int { return a.Index - b.Index }
	if !slices.IsSortedFunc(gpus, byIndex) {
		gpus = slices.Clone(gpus)
		slices.SortFunc(gpus, byIndex)
	}
	n.gpus = len(gpus)
	n.nvlink = make([]bool, n.gpus*n.gpus)
	n.devices = make([]device, 0, len(gpus))
	shared := false
	for a, g := range gpus {
		for _, p := range g.NVLinkPeers {
			for b := range gpus {
				if gpus[b].UUID == p {
					n.nvlink[a*n.gpus+b] = true
					break
				}
			}
		}
		if g.MIGEnabled {
			for _, m := range g.MIGDevices {
				n.devices = append(n.devices, device{uuid: m.UUID, model: g.Model, memoryMiB: m.MemoryMiB, mig: m.Profile, numa: g.NUMANode, index: g.Index, gpu: a, healthy: g.Healthy, parent: g.UUID})
				n.migs++
			}
			continue
		}
		n.devices = append(n.devices, device{uuid: g.UUID, model: g.Model, memoryMiB: g.MemoryMiB, numa: g.NUMANode, index: g.Index, gpu: a, healthy: g.Healthy, parent: g.UUID, shared: g.Shared})
		shared = shared || g.Shared
		if !g.Shared {
			n.wholes++
		}
	}
	n.taken = make([]bool, len(n.devices))
	if shared {
		n.shares = make([]shareUse, len(n.devices))
	}
	// What the ledger holds, in one walk over it: devices, CPU, memory
	// and ports. A held device takes itself and whatever shares its
	// physical GPU exclusively (takenBy): the node's devices may be
	// another split of that GPU than the one it was bound on.
	for i := range v.Ledger.Allocations {
		a := v.Ledger.Allocations[i]
		if a.Share != nil {
			n.shareTake(&a, +1)
		} else {
			for _, u := range a.GPUs {
				n.takenBy(&a, u)
			}
		}
		n.freeCPU -= a.CPUMilli
		n.freeMem -= a.MemoryMiB
		if len(a.Ports) > 0 && n.ports == nil {
			n.ports = map[int]bool{}
		}
		for _, p := range a.Ports {
			n.ports[p] = true
		}
	}
	// A GPU its agent withheld (state.GPU.HeldBy) stays taken while the
	// session it names holds anything here.
	for _, g := range gpus {
		if _, held := v.Ledger.Allocations[g.HeldBy]; g.HeldBy != "" && held {
			for i := range n.devices {
				if n.devices[i].parent == g.UUID {
					n.taken[i] = true
				}
			}
		}
	}
	for i, d := range n.devices {
		if d.healthy {
			n.totalGPU++
		}
		if n.taken[i] {
			n.usedGPU++
		} else if d.healthy && d.whole() {
			n.freeGPUs++
		}
	}
}

// takenBy marks as taken every device of n that device u of allocation a
// excludes (state.Holdings): u itself; every part of u's GPU when u is a
// whole GPU; the whole GPU when u is a part of it. u's physical GPU is the
// one a names, else the one n's inventory gives it, else u.
func (n *nodeState) takenBy(a *state.Allocation, u string) {
	p := a.Parents[u]
	if p == "" {
		p = u
		for i := range n.devices {
			if n.devices[i].uuid == u {
				p = n.devices[i].parent
				break
			}
		}
	}
	for i := range n.devices {
		d := &n.devices[i]
		if d.uuid == u || (p == u && d.parent == u) || (p != u && d.uuid == p) {
			n.taken[i] = true
		}
	}
}

// ownPorts makes n's port set its own before a change: unshared from a
// template, allocated if none.
func (n *nodeState) ownPorts() {
	if n.portsShared {
		n.ports, n.portsShared = maps.Clone(n.ports), false
	}
	if n.ports == nil {
		n.ports = map[int]bool{}
	}
}

// linked reports whether devices a and b are on one GPU or on GPUs joined
// by NVLink.
func (n *nodeState) linked(a, b *device) bool {
	return a.gpu == b.gpu || n.nvlink[a.gpu*n.gpus+b.gpu]
}

// freeDevices counts the free devices that match r: for a fraction, the
// shared GPUs with room for it (of any owner).
func (n *nodeState) freeDevices(r *state.Resources) int {
	return n.freeDevicesWith(r, nil)
}

// freeDevicesWith is freeDevices with r's model matched by m
// (deviceMatchesWith).
func (n *nodeState) freeDevicesWith(r *state.Resources, m *modelMatcher) int {
	if n.lacksKind(r) {
		return 0
	}
	c := 0
	for i := range n.devices {
		if !n.taken[i] && deviceMatchesWith(&n.devices[i], r, m) && n.roomFor(i, r, "") {
			c++
		}
	}
	return c
}

// lacksKind reports, without reading its devices, that n has none of the
// kind r asks for: no shared GPU for a fraction, no MIG device for a MIG
// profile, no whole GPU for whole GPUs (deviceMatches would refuse every
// device). Searches for fractions and MIG devices read every node, and
// the holds' scans for whole GPUs every node until one is closest to
// fitting; at 2,000 nodes many have none of the kind.
func (n *nodeState) lacksKind(r *state.Resources) bool {
	if modelScanReference {
		return false
	}
	if r.Fraction() {
		return n.shares == nil
	}
	if r.MIGProfile != "" {
		return n.migs == 0
	}
	return n.wholes == 0
}

// capacityDevices counts all devices of the node that match r, free or not.
func (n *nodeState) capacityDevices(r *state.Resources) int {
	return n.capacityDevicesWith(r, nil)
}

// capacityDevicesWith is capacityDevices with r's model matched by m
// (deviceMatchesWith).
func (n *nodeState) capacityDevicesWith(r *state.Resources, m *modelMatcher) int {
	if n.lacksKind(r) {
		return 0
	}
	c := 0
	for i := range n.devices {
		if deviceMatchesWith(&n.devices[i], r, m) {
			c++
		}
	}
	return c
}

// hasFreePorts reports whether n has count ports free (freePorts would
// find them), without listing them.
func (n *nodeState) hasFreePorts(count int) bool {
	return n.scanFreePorts(count, nil)
}

// freePorts returns the lowest count free ports of the node's range, or
// nil if there are not enough.
func (n *nodeState) freePorts(count int) []int {
	if count <= 0 {
		return nil
	}
	out := make([]int, 0, count)
	if !n.scanFreePorts(count, &out) {
		return nil
	}
	return out
}

// scanFreePorts reports whether the node's range has count ports free,
// walking it from its lowest port, and appends the ports it finds to
// *out where out is not nil.
func (n *nodeState) scanFreePorts(count int, out *[]int) bool {
	if count <= 0 {
		return true
	}
	r := n.view.Node.Ports
	found := 0
	for p := r.First; p <= r.Last; p++ {
		if n.ports[p] {
			continue
		}
		if out != nil {
			*out = append(*out, p)
		}
		if found++; found == count {
			return true
		}
	}
	return false
}

// reserve records a proposed allocation on the node. The caller has checked
// that it fits.
func (n *nodeState) reserve(id string, a state.Allocation, devs []int) {
	if a.Share != nil {
		n.shareTake(&a, +1)
	} else {
		for _, i := range devs {
			n.taken[i] = true
			n.usedGPU++
			if n.devices[i].whole() {
				n.freeGPUs--
			}
		}
	}
	n.take(&a)
	if n.proposed == nil {
		n.proposed = map[string]state.Allocation{}
	}
	n.proposed[id] = a
	n.proposedIDs = append(n.proposedIDs, id)
}

// unreserve undoes reserve. Like the Kubernetes framework's Unreserve it is
// idempotent: undoing an allocation that is not proposed does nothing.
func (n *nodeState) unreserve(id string) {
	a, ok := n.proposed[id]
	if !ok {
		return
	}
	delete(n.proposed, id)
	for i, pid := range n.proposedIDs {
		if pid == id {
			n.proposedIDs = append(n.proposedIDs[:i], n.proposedIDs[i+1:]...)
			break
		}
	}
	if a.Share != nil {
		n.shareTake(&a, -1)
		n.giveBack(&a)
		return
	}
	for _, u := range a.GPUs {
		for i := range n.devices {
			if n.devices[i].uuid == u && n.taken[i] {
				n.taken[i] = false
				n.usedGPU--
				if n.devices[i].whole() {
					n.freeGPUs++
				}
			}
		}
	}
	n.giveBack(&a)
}

// take counts a's CPU, memory and ports as taken on the node.
func (n *nodeState) take(a *state.Allocation) {
	n.freeCPU -= a.CPUMilli
	n.freeMem -= a.MemoryMiB
	if len(a.Ports) > 0 {
		n.ownPorts()
		for _, p := range a.Ports {
			n.ports[p] = true
		}
	}
}

// giveBack returns a's CPU, memory and ports to the node's free ones.
func (n *nodeState) giveBack(a *state.Allocation) {
	n.freeCPU += a.CPUMilli
	n.freeMem += a.MemoryMiB
	if len(a.Ports) > 0 {
		n.ownPorts()
		for _, p := range a.Ports {
			delete(n.ports, p)
		}
	}
}

// refit checks that allocation a of session id still fits node n on ledger
// l: every device is one of the node's healthy devices and held by no other
// session, CPU and memory stay within the node, every port is in the node's
// range and free, and the node stays within maxSessions (0: no cap). The
// planner chose a on the ledger it read; when the ledger has moved since
// (an agent released, another writer bound), the engine re-checks each
// choice against the ledger it is about to write and compares that
// ledger's revision, as Nomad's plan applier re-checks a plan against the
// newest state. Devices are checked per physical GPU (state.Holdings): an
// allocation of l whose device the inventory no longer lists still
// excludes its GPU. A nil result means a may be added to l; refit then has
// recorded in a the physical GPU of each of its devices that is part of
// one (Allocation.Parents), as n says.
func refit(n *state.Node, l *state.Ledger, id string, a *state.Allocation, maxSessions int) error {
	if _, held := l.Allocations[id]; held {
		return fmt.Errorf("session %s already holds an allocation on %s", id, n.Name)
	}
	if maxSessions > 0 && len(l.Allocations) >= maxSessions {
		return fmt.Errorf("node %s holds its maximum of %d sessions", n.Name, maxSessions)
	}
	healthy := map[string]bool{}
	for _, g := range n.GPUs {
		// A GPU its agent withheld for a session that still holds
		// something here offers nothing (state.GPU.HeldBy).
		_, withheld := l.Allocations[g.HeldBy]
		withheld = withheld && g.HeldBy != "" && g.HeldBy != id
		if g.MIGEnabled {
			for _, m := range g.MIGDevices {
				healthy[m.UUID] = g.Healthy && !withheld && a.Share == nil
			}
			continue
		}
		// A shared GPU offers fractions only, any other GPU no fraction.
		healthy[g.UUID] = g.Healthy && !withheld && g.Shared == (a.Share != nil)
	}
	inv := n.DeviceParents()
	held := state.HoldingsOf(*l, inv)
	if a.Share != nil {
		for _, u := range a.GPUs {
			if !healthy[u] {
				return fmt.Errorf("device %s is not a healthy, shared GPU of %s", u, n.Name)
			}
		}
		if err := refitShare(n, l, held, id, a); err != nil {
			return err
		}
	}
	var parents map[string]string
	for _, u := range a.GPUs {
		if a.Share != nil {
			break // checked by refitShare
		}
		if !healthy[u] {
			return fmt.Errorf("device %s is not a healthy, offered device of %s", u, n.Name)
		}
		p := inv[u]
		if others := held.Excluders(u, p, id); len(others) > 0 {
			return fmt.Errorf("device %s (of physical GPU %s) of %s is held by session %s", u, p, n.Name, others[0])
		}
		if p != u {
			if parents == nil {
				parents = make(map[string]string, len(a.GPUs))
			}
			parents[u] = p
		}
	}
	cpu, mem := l.Used()
	if cpu+a.CPUMilli > n.CPUMilli || mem+a.MemoryMiB > n.MemoryMiB {
		return fmt.Errorf("node %s has %d milli-cores and %d MiB free, needs %d and %d", n.Name, n.CPUMilli-cpu, n.MemoryMiB-mem, a.CPUMilli, a.MemoryMiB)
	}
	used := map[int]bool{}
	for _, p := range l.UsedPorts() {
		used[p] = true
	}
	for _, p := range a.Ports {
		if p < n.Ports.First || p > n.Ports.Last || used[p] {
			return fmt.Errorf("port %d of %s is taken or outside %d-%d", p, n.Name, n.Ports.First, n.Ports.Last)
		}
		used[p] = true
	}
	a.Parents = parents
	return nil
}
