package history

import (
	"fmt"
	"strings"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// Rules, as Violation.Rule names them.
const (
	RuleGPUShared           = "gpu-shared"
	RuleGPUOverShared       = "gpu-over-shared" // share.go
	RuleSharedOwners        = "gpu-shared-owners"
	RuleNodeOver            = "node-over"
	RuleBindingNoAlloc      = "binding-without-allocation"
	RuleAllocNoBinding      = "allocation-without-binding"
	RulePhaseEdge           = "phase-edge"
	RuleFinishedRequeued    = "finished-requeued"
	RuleUndecodable         = "undecodable"
	RuleQueuedButNotPending = "queued-not-pending"
	RuleGap                 = "history-gap"
	RulePartUnbound         = "part-without-binding"
	RuleArrayOverCap        = "array-over-cap"
	RuleArrayRetiredEarly   = "array-retired-early"
	RuleBindingDiffers      = "binding-differs"
	RuleDeviceUnknown       = "device-not-in-inventory"
	RuleLeftBehind          = "left-behind"
	RuleStuck               = "no-progress"
	RuleContainerUnbound    = "container-without-binding"
	RuleLaunchedTwice       = "launched-twice" // launch.go
)

// Violation is one broken rule: at Revision, Key is in a state Rule forbids.
type Violation struct {
	Revision int64
	Key      string
	Rule     string
	Detail   string
}

func (v Violation) String() string {
	return fmt.Sprintf("revision %d key %s rule %s: %s", v.Revision, v.Key, v.Rule, v.Detail)
}

// Change is one key's change in a revision: Value is nil for a delete.
// Version, when not 0, is etcd's version of the key after a put (its puts
// since it was created: 1 for a create), as a watch event or a list
// reports it; the gap rule checks each status's versions follow on from
// the model's, so a missed revision cannot hide a move, and the accrual
// rule reads an overwrite from it. Prev, when not nil, is the key's value
// before the change (a watch's WithPrevKV, which costs etcd a read a
// event; Watch does not ask for it): the phase rule then reads the
// previous status from it rather than from the model.
type Change struct {
	Key     string
	Value   []byte
	Prev    []byte
	Version int64
}

// Checker is the model the rules are checked against. It is not safe for
// concurrent use; Watch drives one from a single goroutine.
type Checker struct {
	k        state.Keys
	nodes    map[string]state.Node
	ledgers  map[string]state.Ledger
	bindings map[string]map[string]int64 // node → session id → the binding's create revision (0: unknown, listed by Load)
	pending  map[string]bool
	statuses map[string]state.Status
	// versions are the statuses' etcd versions (Change.Version), by
	// session, where known.
	versions map[string]int64
	// held indexes every ledger's devices per physical GPU, with holders
	// "node/session"; heldInv is the inventory (device → physical GPU)
	// each node's ledger was indexed with, to unindex it alike.
	held     *state.Holdings
	heldInv  map[string]map[string]string
	arrays   map[string]int             // array id → its cap (maxRunning)
	finished map[string]bool            // array id → its record says finished
	members  map[string]map[string]bool // array id → its elements' session ids
	rev      int64
	binds    int64
	acct     accruals  // accrual.go
	tm       teamModel // teams.go

	// bound are the devices and ports each binding names (node, session).
	bound map[[2]string]boundView
	// holds says, per session, the nodes where it has a binding (bit 1)
	// or an allocation (bit 2).
	holds map[string]map[string]uint8
	// parts are the parts agents reported, as their phase and binding.
	parts map[[2]string]partView
	// clock is the history's own time: the latest time a value written
	// says it was written at (a status's or part's updated, a binding's
	// bound, a node's registration). The time-bound rules read it.
	clock, scanned time.Time
	stuckAfter     time.Duration
	// due are the sessions that must make progress: since when (a phase
	// of Bound, Starting or Stopping entered, or a waiting session's
	// retryAt), and what they wait in.
	due map[string]dueView
	// left are the sessions that ended (or wait to run again) while
	// holding a binding or an allocation, since when.
	left map[string]time.Time
	// launches are the attempts' launches by session, until its status
	// is deleted (launch.go).
	launches map[string]map[launchKey]launchRecord
}

type boundView struct {
	gpus  []string
	ports []int
}

type partView struct {
	phase      state.Phase
	bindingRev int64
}

type dueView struct {
	since time.Time
	what  string
}

// New returns a Checker of an empty keyspace under k's prefix.
func New(k state.Keys) *Checker {
	return &Checker{k: k, nodes: map[string]state.Node{}, ledgers: map[string]state.Ledger{},
		bindings: map[string]map[string]int64{}, pending: map[string]bool{},
		statuses: map[string]state.Status{}, versions: map[string]int64{}, held: state.NewHoldings(), heldInv: map[string]map[string]string{},
		arrays: map[string]int{}, finished: map[string]bool{}, members: map[string]map[string]bool{},
		bound: map[[2]string]boundView{}, holds: map[string]map[string]uint8{}, parts: map[[2]string]partView{},
		due: map[string]dueView{}, left: map[string]time.Time{}, launches: map[string]map[launchKey]launchRecord{},
		stuckAfter: DefaultStuckAfter}
}

// Revision is the last revision applied.
func (c *Checker) Revision() int64 { return c.rev }

// Binds counts the binds applied: statuses that became Bound.
func (c *Checker) Binds() int64 { return c.binds }

// Load sets the model to the keyspace as listed at revision rev, without
// checking transitions (a history has to start somewhere), and returns the
// violations that state already holds.
func (c *Checker) Load(rev int64, kvs []Change) []Violation {
	return c.apply(rev, kvs, false)
}

// Apply applies the changes of one revision, which must be later than the
// last applied, and returns the violations after it.
func (c *Checker) Apply(rev int64, changes []Change) []Violation {
	return c.apply(rev, changes, true)
}

// touched collects what a revision changed, to check only that.
type touched struct {
	pairs    map[[2]string]bool // node, session: binding ⇔ allocation
	nodes    map[string]bool    // capacity
	sessions map[string]bool    // queue entry ⇔ status
	ledgers  []string           // indexed after every old value left the index
	arrays   map[string]bool    // arrays whose unfinished elements to count
	// unbound are the bindings this revision deleted (node, session →
	// create revision): a release writes its part as it deletes them.
	unbound map[[2]string]int64
	parts   []partWrite
	// held are the sessions whose bindings or allocations changed.
	held map[string]bool
	// retired are the arrays whose record this revision deleted, and
	// whether the record had said finished.
	retired map[string]bool
	// unlaunch are the sessions whose status or a binding this revision
	// deleted: their launches are forgotten if nothing of them is left
	// (launch.go).
	unlaunch map[string]bool
}

// partWrite is a part put by a revision, checked once the whole revision
// is applied.
type partWrite struct {
	key, node, id string
	p             state.PartStatus
	// launch says the write records a launch; twice, why that launch is
	// the attempt's second (launch.go).
	launch bool
	twice  string
}

func (c *Checker) apply(rev int64, changes []Change, transitions bool) []Violation {
	var out []Violation
	bad := func(key, rule, format string, args ...any) {
		out = append(out, Violation{Revision: rev, Key: key, Rule: rule, Detail: fmt.Sprintf(format, args...)})
	}
	t := touched{pairs: map[[2]string]bool{}, nodes: map[string]bool{}, sessions: map[string]bool{}, unbound: map[[2]string]int64{},
		arrays: map[string]bool{}, retired: map[string]bool{}, held: map[string]bool{}, unlaunch: map[string]bool{}}
	k := c.k
	for _, ch := range changes {
		key := ch.Key
		switch {
		case strings.HasPrefix(key, k.Ledgers()):
			name, ok := k.NodeName(key)
			if !ok {
				continue
			}
			old := c.ledgers[name]
			c.unindex(name, old)
			c.chargeTeams(old, -1)
			for id := range old.Allocations {
				t.pairs[[2]string{name, id}] = true
				c.hold(id, name, 2, false)
				t.held[id] = true
			}
			if ch.Value == nil {
				delete(c.ledgers, name)
			} else {
				l, err := state.Decode[state.Ledger](ch.Value)
				if err != nil {
					bad(key, RuleUndecodable, "%v", err)
					continue
				}
				c.ledgers[name] = l
				c.chargeTeams(l, +1)
				for id := range l.Allocations {
					t.pairs[[2]string{name, id}] = true
					c.hold(id, name, 2, true)
					t.held[id] = true
				}
			}
			t.nodes[name] = true
			t.ledgers = append(t.ledgers, name)
		case strings.HasPrefix(key, k.Arrays()):
			id, ok := k.ArrayID(key)
			if !ok {
				continue
			}
			if ch.Value == nil {
				if transitions {
					t.retired[id] = c.finished[id]
				}
				delete(c.arrays, id)
				delete(c.finished, id)
				continue
			}
			a, err := state.Decode[state.Array](ch.Value)
			if err != nil {
				bad(key, RuleUndecodable, "%v", err)
				continue
			}
			c.arrays[id] = a.MaxRunning
			c.finished[id] = a.Finished != nil
			t.arrays[id] = true
		case strings.HasPrefix(key, k.Sessions()):
			// Only array membership is modelled: an element's spec says
			// which array it counts against, until it is deleted.
			if ch.Value == nil {
				if id, ok := k.SessionID(key); ok {
					if arr, _, ok := state.ElementOf(id); ok {
						delete(c.members[arr], id)
					}
				}
				continue
			}
			s, err := state.Decode[state.Session](ch.Value)
			if err != nil {
				bad(key, RuleUndecodable, "%v", err)
				continue
			}
			if s.Array != nil {
				if c.members[s.Array.ID] == nil {
					c.members[s.Array.ID] = map[string]bool{}
				}
				c.members[s.Array.ID][s.ID] = true
				t.arrays[s.Array.ID] = true
			}
		case strings.HasPrefix(key, k.Nodes()):
			name, ok := k.NodeName(key)
			if !ok {
				continue
			}
			if ch.Value == nil {
				delete(c.nodes, name)
				continue
			}
			n, err := state.Decode[state.Node](ch.Value)
			if err != nil {
				bad(key, RuleUndecodable, "%v", err)
				continue
			}
			c.nodes[name] = n
			c.tick(n.Registered)
			t.nodes[name] = true
		case strings.HasPrefix(key, k.AllBindings()):
			node, id, ok := k.BindingKey(key)
			if !ok {
				continue
			}
			if c.bindings[node] == nil {
				c.bindings[node] = map[string]int64{}
			}
			created, had := c.bindings[node][id]
			pair := [2]string{node, id}
			if ch.Value != nil {
				b, err := state.Decode[state.Binding](ch.Value)
				if err != nil {
					bad(key, RuleUndecodable, "%v", err)
					continue
				}
				c.bound[pair] = boundView{gpus: b.GPUs, ports: b.Ports}
				c.tick(b.Bound)
			}
			switch {
			case ch.Value == nil:
				if had {
					t.unbound[pair] = created
				}
				delete(c.bindings[node], id)
				delete(c.bound, pair)
			case !had && transitions:
				c.bindings[node][id] = rev
			case !had:
				c.bindings[node][id] = 0 // listed: its create revision is not known
			}
			c.hold(id, node, 1, ch.Value != nil)
			t.held[id] = true
			t.pairs[pair] = true
			if ch.Value == nil {
				t.unlaunch[id] = true
			}
		case strings.HasPrefix(key, k.Parts()):
			node, id, ok := k.PartKey(key)
			if !ok {
				continue
			}
			if ch.Value == nil {
				delete(c.parts, [2]string{node, id}) // the merger deletes parts at will
				continue
			}
			p, err := state.Decode[state.PartStatus](ch.Value)
			if err != nil {
				bad(key, RuleUndecodable, "%v", err)
				continue
			}
			launch, twice := c.notePart(node, id, p)
			c.parts[[2]string{node, id}] = partView{phase: p.Phase, bindingRev: p.BindingRevision}
			c.tick(p.Updated)
			if transitions {
				t.parts = append(t.parts, partWrite{key: key, node: node, id: id, p: p, launch: launch, twice: twice})
			}
		case strings.HasPrefix(key, k.Accruals()):
			c.checkAccrual(ch, transitions, bad)
		case strings.HasPrefix(key, k.Teams()):
			c.noteTeam(key, ch.Value, bad)
		case strings.HasPrefix(key, k.PendingDir()):
			id, ok := k.SessionID(key)
			if !ok {
				continue
			}
			c.pending[id] = ch.Value != nil
			if ch.Value == nil {
				delete(c.pending, id)
			}
			t.sessions[id] = true
		case strings.HasPrefix(key, k.StatusDir()):
			id, ok := k.SessionID(key)
			if !ok {
				continue
			}
			old, existed := c.statuses[id]
			if transitions {
				c.checkVersion(key, id, ch, existed, bad)
			}
			if ch.Value == nil || ch.Version == 0 {
				delete(c.versions, id)
			} else {
				c.versions[id] = ch.Version
			}
			if ch.Prev != nil {
				prev, err := state.Decode[state.Status](ch.Prev)
				if err != nil {
					bad(key, RuleUndecodable, "previous value: %v", err)
					continue
				}
				if existed && transitions && prev.Phase != old.Phase {
					bad(key, RuleGap, "etcd's previous phase is %s, the checker's %s: a revision was missed", prev.Phase, old.Phase)
				}
				old, existed = prev, true
			}
			if ch.Value == nil {
				delete(c.statuses, id)
				delete(c.due, id)
				delete(c.left, id)
				t.unlaunch[id] = true // its launches go once nothing of it is bound (launch.go)
				if transitions {
					if ok, _ := state.Edge(old.Phase, ""); !ok {
						bad(key, RulePhaseEdge, "status of a live session (%s) deleted", old.Phase)
					}
					if existed {
						c.checkRetired(key, id, old, bad) // accrual.go
					}
				}
				continue
			}
			st, err := state.Decode[state.Status](ch.Value)
			if err != nil {
				bad(key, RuleUndecodable, "%v", err)
				continue
			}
			c.statuses[id] = st
			c.noteAttempt(id, st)
			c.tick(st.Updated)
			c.progress(id, st, old, existed)
			t.sessions[id] = true
			if arr, _, ok := state.ElementOf(id); ok && c.members[arr][id] {
				t.arrays[arr] = true
			}
			if !transitions {
				continue
			}
			if st.Phase == state.PhaseBound && old.Phase != state.PhaseBound {
				c.binds++
			}
			switch {
			case !existed && st.Phase != state.PhasePending:
				bad(key, RulePhaseEdge, "a new session's first phase is %s, want Pending", st.Phase)
			case existed && old.Phase.Terminal() && !st.Phase.Terminal():
				bad(key, RuleFinishedRequeued, "finished session (%s) is %s again", old.Phase, st.Phase)
			case existed:
				if ok, _ := state.Edge(old.Phase, st.Phase); !ok {
					bad(key, RulePhaseEdge, "%s → %s is no edge of the state machine", old.Phase, st.Phase)
				}
			}
		}
	}
	for _, name := range t.ledgers {
		if l, ok := c.ledgers[name]; ok {
			for _, v := range c.index(name, l) {
				bad(k.Ledger(name), RuleGPUShared, "%s", v)
			}
			over, owners := c.overShared(name, l)
			for _, v := range over {
				bad(k.Ledger(name), RuleGPUOverShared, "%s", v)
			}
			for _, v := range owners {
				bad(k.Ledger(name), RuleSharedOwners, "%s", v)
			}
		}
	}
	for p := range t.pairs {
		node, id := p[0], p[1]
		_, alloc := c.ledgers[node].Allocations[id]
		_, bound := c.bindings[node][id]
		switch {
		case bound && !alloc:
			bad(k.Binding(node, id), RuleBindingNoAlloc, "binding of %s on %s has no allocation in the ledger", id, node)
		case alloc && !bound:
			bad(k.Ledger(node), RuleAllocNoBinding, "allocation of %s on %s has no binding", id, node)
		case alloc && bound:
			a, b := c.ledgers[node].Allocations[id], c.bound[p]
			if !sameSet(a.GPUs, b.gpus) || !sameSet(a.Ports, b.ports) {
				bad(k.Binding(node, id), RuleBindingDiffers, "binding of %s on %s names devices %v and ports %v, its allocation %v and %v", id, node, b.gpus, b.ports, a.GPUs, a.Ports)
			}
		}
	}
	for name := range t.nodes {
		for _, d := range c.unknownDevices(name) {
			bad(k.Ledger(name), RuleDeviceUnknown, "%s", d)
		}
	}
	for pair, gone := range t.unbound {
		if pv, ok := c.parts[pair]; ok && (pv.phase == state.PhaseStarting || pv.phase == state.PhaseRunning || pv.phase == state.PhaseStopping) &&
			(gone == 0 || pv.bindingRev == gone) {
			bad(k.Part(pair[0], pair[1]), RuleContainerUnbound, "the agent of %s reports the container of %s %s, and its binding is gone", pair[0], pair[1], pv.phase)
		}
	}
	if transitions {
		for id := range t.sessions {
			t.held[id] = true
		}
		for id := range t.held {
			if d := c.leftBehind(id); d != "" {
				bad(k.Status(id), RuleLeftBehind, "%s", d)
			}
			c.runningUnbound(id)
		}
		if c.clock.Sub(c.scanned) >= time.Second {
			c.scanned = c.clock
			for _, v := range c.overdue() {
				bad(k.Status(v[0]), v[1], "%s", v[2])
			}
		}
	}
	elastic := make(map[string]bool, len(t.held)+len(t.sessions))
	for id := range t.held {
		elastic[id] = true
	}
	for id := range t.sessions {
		elastic[id] = true
	}
	for _, v := range c.elasticOver(elastic) {
		bad(k.Status(v[0]), RuleElasticOverSize, "%s", v[1])
	}
	for _, w := range t.parts {
		if w.twice != "" {
			bad(w.key, RuleLaunchedTwice, "%s", w.twice)
		} else if w.launch {
			if why := c.launchNotLive(w); why != "" {
				bad(w.key, RuleLaunchedTwice, "%s", why)
			}
		}
		cur, bound := c.bindings[w.node][w.id]
		gone, released := t.unbound[[2]string{w.node, w.id}]
		switch {
		case w.p.Node != w.node || w.p.Session != w.id:
			bad(w.key, RulePartUnbound, "part says session %s on %s", w.p.Session, w.p.Node)
		case bound && (cur == 0 || cur == w.p.BindingRevision):
		case released && (gone == 0 || gone == w.p.BindingRevision):
		default:
			bad(w.key, RulePartUnbound, "part of %s on %s written for the binding of revision %d, which %s does not hold", w.id, w.node, w.p.BindingRevision, w.node)
		}
	}
	c.teamsOver(transitions, bad)
	for name := range t.nodes {
		for _, d := range c.over(name) {
			bad(k.Ledger(name), RuleNodeOver, "%s", d)
		}
	}
	for id := range t.sessions {
		st, has := c.statuses[id]
		if !c.pending[id] || !has {
			continue
		}
		switch {
		case st.Phase.Terminal():
			bad(k.Pending(id), RuleFinishedRequeued, "finished session (%s) has a queue entry", st.Phase)
		case st.Phase != state.PhasePending:
			bad(k.Pending(id), RuleQueuedButNotPending, "session with a queue entry is %s", st.Phase)
		}
	}
	for id := range t.arrays {
		if n, limit := c.unfinished(id); limit > 0 && n > limit {
			bad(k.Array(id), RuleArrayOverCap, "%d elements unfinished, the cap is %d", n, limit)
		}
	}
	for id := range t.unlaunch {
		c.forgetLaunches(id)
	}
	for id, finished := range t.retired {
		left := len(c.members[id])
		switch {
		case !finished:
			bad(k.Array(id), RuleArrayRetiredEarly, "array deleted before its record said finished")
		case left > 0:
			bad(k.Array(id), RuleArrayRetiredEarly, "array deleted while %d of its elements are still in etcd", left)
		}
		delete(c.members, id)
	}
	c.rev = rev
	return out
}

// unfinished counts the elements of array id that exist and have not
// ended, and returns the array's cap (0: none, or no record seen).
func (c *Checker) unfinished(id string) (n, limit int) {
	for sid := range c.members[id] {
		if st, ok := c.statuses[sid]; ok && !st.Phase.Terminal() {
			n++
		}
	}
	return n, c.arrays[id]
}

// over describes how node's ledger exceeds its inventory; nothing when the
// node has no inventory now (its lease expired: its ledger is being
// cleared).
func (c *Checker) over(name string) []string {
	n, ok := c.nodes[name]
	l := c.ledgers[name]
	if !ok || len(l.Allocations) == 0 {
		return nil
	}
	var out []string
	cpu, mem := l.Used()
	if cpu > n.CPUMilli {
		out = append(out, fmt.Sprintf("CPU %dm allocated of %dm", cpu, n.CPUMilli))
	}
	if mem > n.MemoryMiB {
		out = append(out, fmt.Sprintf("memory %d MiB allocated of %d MiB", mem, n.MemoryMiB))
	}
	ports := l.UsedPorts()
	for i, p := range ports {
		if i > 0 && ports[i-1] == p {
			out = append(out, fmt.Sprintf("port %d allocated twice", p))
		}
		if p < n.Ports.First || p > n.Ports.Last {
			out = append(out, fmt.Sprintf("port %d outside the node's range %d-%d", p, n.Ports.First, n.Ports.Last))
		}
	}
	return out
}

// checkVersion holds a status's put to the version the model knows of it
// (Change.Version): a create while the model holds the status, a version
// that does not follow on from the model's, or an update of a status the
// model does not hold, means a revision of it was missed.
func (c *Checker) checkVersion(key, id string, ch Change, existed bool, bad func(key, rule, format string, args ...any)) {
	if ch.Value == nil || ch.Version == 0 {
		return
	}
	known, ok := c.versions[id]
	switch {
	case existed && ch.Version == 1:
		bad(key, RuleGap, "created while the checker holds it: its delete was missed")
	case existed && ok && ch.Version != known+1:
		bad(key, RuleGap, "etcd's version %d follows the checker's %d: %d revisions of it were missed", ch.Version, known, ch.Version-known-1)
	case !existed && ch.Version > 1:
		bad(key, RuleGap, "updated (version %d) while the checker does not hold it: its create was missed", ch.Version)
	}
}
