package placer

import (
	"context"
	"maps"
	"runtime"
	"sync"

	"github.com/voyager-gpu/voyager/state"
)

// The commit pipeline: the committer keeps Config.Parallel bind
// transactions in flight, each after the batches it builds on; the streamer
// cuts batches while the plan is still being made.

// committer commits one pass's batches, Parallel in flight, each once the
// batches it is sent after have committed or failed: a batch that writes a
// ledger an earlier batch of the pass writes builds on that batch's write
// (buildBatch reads this placer's own writes). It adds what it bound to
// res.
type committer struct {
	p     *Placer
	ctx   context.Context
	nodes map[string]*NodeView
	snap  *Snapshot
	// prior is this placer's newest bind before this pass: the pass's own
	// batches raise lastBind as they commit, and were planned together.
	prior int64
	// Refused batches are read back and retried only beside other
	// sharded placers: alone or active, a placer loses sessions only to
	// cancels (or, for moments, to a placer that thinks it is active
	// too), and the read-back would lengthen every transaction it sends.
	readBack bool
	sem      chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	res      *passResult
	sent     int
}

// newCommitter returns the committer of a pass planned on snap, whose node
// views are nodes; each batch writes on the ledgers cached when it commits,
// and on this placer's own writes newer than those.
func (p *Placer) newCommitter(ctx context.Context, nodes map[string]*NodeView, snap *Snapshot, res *passResult) *committer {
	return &committer{p: p, ctx: ctx, nodes: nodes, snap: snap,
		prior: p.lastBind.Load(), readBack: p.cfg.Sharded && len(p.owners()) > 1,
		sem: make(chan struct{}, p.cfg.Parallel), res: res}
}

// send commits b once every batch of after is done, without waiting; the
// returned channel is closed when b is done.
func (c *committer) send(b *bindBatch, after []<-chan struct{}) <-chan struct{} {
	done := make(chan struct{})
	c.sent++
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer close(done)
		for _, a := range after {
			<-a
		}
		c.sem <- struct{}{}
		defer func() { <-c.sem }()
		c.commit(b)
	}()
	return done
}

// wait returns once every batch sent is done.
func (c *committer) wait() { c.wg.Wait() }

func (c *committer) commit(b *bindBatch) {
	p, res := c.p, c.res
	// The newest ledgers, read as the batch commits: a batch on a ledger
	// another writer (an agent releasing a session) has moved since the
	// snapshot re-checks its choices on it (buildBatch) rather than being
	// refused. A streamed pass's batches commit while it plans, so each
	// reads its own.
	n, rev, stale, err := p.commitBatch(c.ctx, b, p.ledgers.Snapshot(), c.nodes, c.snap, c.prior, c.readBack)
	c.mu.Lock()
	defer c.mu.Unlock()
	res.conflicts += stale
	switch {
	case err != nil:
		if c.ctx.Err() == nil {
			p.log.Warn("bind transaction failed", "err", err, "sessions", len(b.decisions))
		}
		res.conflicts++
	case n == 0 && rev == 0 && stale > 0:
		// Nothing left to commit: every choice went stale.
		p.conflicts.Add(1)
	case n == 0:
		p.conflicts.Add(1)
		res.conflicts++
	default:
		res.bindRev = max(res.bindRev, rev)
		p.lastBind.Store(max(p.lastBind.Load(), rev))
		p.txns.Add(1)
		p.bound.Add(int64(n))
		res.bound += n
	}
}

// streamer packs a plan's decisions into batches as the plan makes them
// (planEmitting), and sends each batch to commit once full, so that the
// first binds go out while the rest of the queue is still being planned.
// A decision waits until the plan has filled every node it is on (no GPU
// device left free), or the plan ends: a node's decisions then go out
// together, its ledger written once, as a pass that commits after its plan
// writes it. A decision on a node that a batch already sent writes (a
// CPU-only session on a full node) goes into a later batch, sent after
// that one: its ledger write builds on the earlier one. Nothing is
// deferred: every decision that fits a transaction is sent in this pass.
type streamer struct {
	// send commits a batch after others (committer.send).
	send   func(b *bindBatch, after []<-chan struct{}) <-chan struct{}
	nodes  map[string]*NodeView
	snap   *Snapshot
	budget state.TxnBudget
	open   *bindBatch
	after  []<-chan struct{} // what the open batch is sent after
	// last is the latest batch sent that writes a node; grown is what
	// the batches sent add to the node's ledger, in estimated bytes.
	last  map[string]<-chan struct{}
	grown map[string]int
	// held are the decisions on nodes the plan has not filled yet, by
	// node; waiting lists them in plan order.
	held    map[string][]*heldDecision
	waiting []*heldDecision
	unfit   []Decision
	chains  int             // batches sent after another
	scratch map[string]bool // for sizes, cleared before use
}

// heldDecision is a decision waiting for nodes of it to fill.
type heldDecision struct {
	d       Decision
	nodes   int // nodes of it not full yet
	offered bool
}

func (p *Placer) newStreamer(c *committer) *streamer {
	return &streamer{send: c.send, nodes: c.nodes, snap: c.snap, budget: p.budget(), last: map[string]<-chan struct{}{}, grown: map[string]int{},
		held: map[string][]*heldDecision{}, scratch: map[string]bool{}}
}

// offer takes the plan's next decision: full tells which nodes the plan
// has filled so far.
func (s *streamer) offer(d Decision, full func(string) bool) {
	h := &heldDecision{d: d}
	var ready []Decision
	for _, pp := range d.Parts {
		if !full(pp.Node) {
			h.nodes++
			s.held[pp.Node] = append(s.held[pp.Node], h)
			continue
		}
		// d filled the node, or it was full already: what waited on it
		// goes now, in plan order, before d.
		for _, w := range s.held[pp.Node] {
			if w.nodes--; w.nodes == 0 {
				w.offered = true
				ready = append(ready, w.d)
			}
		}
		delete(s.held, pp.Node)
	}
	if h.nodes == 0 {
		ready = append(ready, d)
	} else {
		s.waiting = append(s.waiting, h)
	}
	s.addGroup(ready)
}

// end sends what is left once the plan is made: the decisions on nodes it
// did not fill, grouped by head node in plan order, and the open batch.
func (s *streamer) end() {
	groups := map[string][]Decision{}
	var heads []string
	for _, h := range s.waiting {
		if h.offered {
			continue
		}
		head := h.d.Parts[0].Node
		if _, ok := groups[head]; !ok {
			heads = append(heads, head)
		}
		groups[head] = append(groups[head], h.d)
	}
	for _, head := range heads {
		s.addGroup(groups[head])
	}
	s.waiting, s.held = nil, nil
	s.flush()
}

// addGroup adds ds, a node's decisions, to the open batch, sending that
// batch first when they do not all fit in it.
func (s *streamer) addGroup(ds []Decision) {
	if len(ds) == 0 {
		return
	}
	if s.open != nil {
		seen := maps.Clone(s.open.nodes)
		need := s.open.size
		for i := range ds {
			need = need.Plus(s.size(&ds[i], seen))
		}
		if !s.budget.Fits(need) {
			s.flush()
		}
	}
	for _, d := range ds {
		s.add(d)
	}
}

// size is what d adds to a batch that writes the ledgers of seen (which it
// extends): decisionSize, with what earlier batches of the pass added to
// the ledgers d's batch writes again.
func (s *streamer) size(d *Decision, seen map[string]bool) state.TxnSize {
	var added []string
	for _, pp := range d.Parts {
		if !seen[pp.Node] && s.grown[pp.Node] > 0 {
			added = append(added, pp.Node)
		}
	}
	z := decisionSize(d, seen, s.nodes, s.snap)
	for _, n := range added {
		z.Bytes += s.grown[n]
	}
	return z
}

// add puts d in the open batch, sending that batch first when d does not
// fit in it.
func (s *streamer) add(d Decision) {
	clear(s.scratch)
	if !s.budget.Fits(decisionSize(&d, s.scratch, s.nodes, s.snap)) {
		s.unfit = append(s.unfit, d)
		return
	}
	if s.open == nil {
		s.open = &bindBatch{nodes: map[string]bool{}}
	}
	seen := maps.Clone(s.open.nodes)
	add := s.size(&d, seen)
	if len(s.open.decisions) > 0 && !s.budget.Fits(s.open.size.Plus(add)) {
		s.flush()
		s.open = &bindBatch{}
		seen = map[string]bool{}
		add = s.size(&d, seen)
	}
	for _, pp := range d.Parts {
		if !s.open.nodes[pp.Node] {
			if done, ok := s.last[pp.Node]; ok {
				s.after = append(s.after, done)
			}
		}
	}
	s.open.decisions = append(s.open.decisions, d)
	s.open.size = s.open.size.Plus(add)
	s.open.nodes = seen
	if !s.budget.Fits(s.open.size) {
		// Alone it fits, but with what earlier batches added to its
		// ledgers it is over the estimate: it goes alone, and
		// commitBatch's exact check decides.
		s.flush()
	}
}

// flush sends the open batch.
func (s *streamer) flush() {
	b := s.open
	if b == nil {
		return
	}
	if len(s.after) > 0 {
		s.chains++
	}
	done := s.send(b, s.after)
	// Let the batch's goroutine start now: made by this one, it waits on
	// this P until the plan stops running, which a plan of 3,000 sessions
	// did only when preempted, every 10 ms, so its batches went out in
	// clumps and etcd waited between them.
	runtime.Gosched()
	for n := range b.nodes {
		s.last[n] = done
	}
	for i := range b.decisions {
		d := &b.decisions[i]
		for _, pp := range d.Parts {
			s.grown[pp.Node] += allocationBytes(d.Pending.Entry.Session, d.Pending.Entry, len(pp.Devices), len(pp.Ports))
		}
	}
	s.open, s.after = nil, nil
}
