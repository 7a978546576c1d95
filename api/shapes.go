package api

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
)

// shapeIndex keeps, for the admission check, a few nodes of every distinct
// node shape: what a request could ever get does not depend on a node's
// name, address or device UUIDs, so planning a request alone on empty
// nodes needs each shape only as many times as one session may use nodes
// (a Ray head and its workers, each on its own node). A site of 10,000
// identical nodes plans over a few dozen instead of all of them, and the
// index is rebuilt only when the nodes cache moves.
type shapeIndex struct {
	mu    sync.Mutex
	rev   int64
	nodes []state.Node
	// took is how long the last rebuild took, for the logs.
	took time.Duration
	// verdicts memoises the admission check by request (verdictKey) for
	// the nodes of verdictsRev: a site's creates repeat a few request
	// shapes, and each check plans over the shapes' nodes (60 KB of
	// garbage a create, a fifth of the API's at 200 creates/s on a full
	// 10,000-node site).
	verdicts    map[string][]FieldError
	verdictsRev int64
}

// maxVerdicts bounds the memoised admission checks; past it the memo
// starts again.
const maxVerdicts = 4096

// feasible is feasibility over feasibilityNodes, memoised by request for
// the nodes cache's revision.
func (a *API) feasible(s state.Session, now time.Time) []FieldError {
	nodes, rev := a.feasibilityNodes()
	key, err := verdictKey(s, now)
	if err != nil {
		return feasibility(s, nodes, a.cfg.Plan, now)
	}
	a.shapes.mu.Lock()
	v, ok := a.shapes.verdicts[key]
	ok = ok && a.shapes.verdictsRev == rev
	a.shapes.mu.Unlock()
	if !ok {
		v = feasibility(s, nodes, a.cfg.Plan, now)
		a.shapes.mu.Lock()
		if a.shapes.verdictsRev != rev || len(a.shapes.verdicts) >= maxVerdicts {
			a.shapes.verdicts, a.shapes.verdictsRev = map[string][]FieldError{}, rev
		}
		a.shapes.verdicts[key] = v
		a.shapes.mu.Unlock()
	}
	return slices.Clone(v)
}

// verdictKey is what of s the admission check reads: its queue entry
// without who asked, when, or at what priority (the check plans the
// request alone, on empty nodes with no quotas), and whether it is a Ray
// session (which names the field an error is reported on). A range of
// machines (elastic minNodes) is planned down to its minimum: not the
// verdict of a fixed job of its maximum.
func verdictKey(s state.Session, now time.Time) (string, error) {
	q := state.NewQueueEntry(s, now)
	minNodes := 0
	if el := q.Elastic; el != nil && el.ByNodes() {
		minNodes = el.MinNodes
	}
	b, err := json.Marshal(struct {
		Kind          state.SessionKind
		Request       state.Resources
		Workers       int
		WorkerRequest *state.Resources
		Nodes         int
		Ray           bool
		MinNodes      int `json:",omitempty"`
	}{q.Kind, q.Request, q.Workers, q.WorkerRequest, q.Nodes, s.Ray != nil, minNodes})
	return string(b), err
}

// feasibilityNodes returns the nodes the admission check plans over (up to
// perShape nodes of every shape among the live nodes, in name order) and
// the nodes cache's revision they were taken from.
func (a *API) feasibilityNodes() ([]state.Node, int64) {
	snap := a.nodes.Snapshot()
	a.shapes.mu.Lock()
	defer a.shapes.mu.Unlock()
	if a.shapes.nodes != nil && a.shapes.rev == snap.Revision() {
		return a.shapes.nodes, a.shapes.rev
	}
	start := time.Now()
	perShape := 1 + placer.MaxRayWorkers(a.cfg.Plan.MaxTxnOps, 0)
	count := map[string]int{}
	out := []state.Node{}
	for _, it := range snap.List() {
		name, ok := a.keys.NodeName(it.Key)
		if !ok {
			continue
		}
		n := it.Value
		n.Name = name
		key := shapeKey(n)
		if count[key] >= perShape {
			continue
		}
		count[key]++
		out = append(out, n)
	}
	a.shapes.rev, a.shapes.nodes, a.shapes.took = snap.Revision(), out, time.Since(start)
	a.log.Debug("admission node shapes rebuilt", "nodes", snap.Len(), "shapes", len(count), "kept", len(out), "took", a.shapes.took)
	return out, a.shapes.rev
}

// shapeKey is n with everything that cannot change what a request may get
// removed: name, address, agent version, registration time, device
// UUIDs (renamed by position, NVLink peers with them) and PCI addresses.
func shapeKey(n state.Node) string {
	ids := map[string]string{}
	for i, g := range n.GPUs {
		ids[g.UUID] = fmt.Sprintf("g%d", i)
		for j, m := range g.MIGDevices {
			ids[m.UUID] = fmt.Sprintf("g%d/m%d", i, j)
		}
	}
	rename := func(u string) string {
		if r, ok := ids[u]; ok {
			return r
		}
		return "?" + u // a peer that is not on the node: keep it apart
	}
	c := state.Node{Labels: n.Labels, CPUMilli: n.CPUMilli, MemoryMiB: n.MemoryMiB, Ports: n.Ports, GPUs: make([]state.GPU, len(n.GPUs))}
	for i, g := range n.GPUs {
		g.UUID, g.PCIBusID = rename(g.UUID), ""
		peers := make([]string, len(g.NVLinkPeers))
		for j, p := range g.NVLinkPeers {
			peers[j] = rename(p)
		}
		sort.Strings(peers)
		g.NVLinkPeers = peers
		migs := make([]state.MIGDevice, len(g.MIGDevices))
		for j, m := range g.MIGDevices {
			m.UUID = rename(m.UUID)
			migs[j] = m
		}
		g.MIGDevices = migs
		c.GPUs[i] = g
	}
	b, _ := json.Marshal(c) // a struct of plain fields: cannot fail
	return string(b)
}
