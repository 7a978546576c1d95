package placer

import (
	"path"
	"sync"
	"sync/atomic"
)

// Model pattern matches (issues 34 and 36). A request's gpuModel is a
// shell pattern ("*H100*") matched against a device's model, and a pass
// matches it against every device it looks at: the holds alone
// (hold.go closest) match each held request against every device of
// every node. At 2,000 nodes with 20,000 queued and a third of them
// naming a model, path.Match took 88% of a pass
// (BenchmarkNewPlanTeamModels). Patterns and models are few, so each
// (pattern, model) pair is matched once and remembered.

// modelScanReference, set only by TestModelScanMatchesReference (never
// while a plan is being made), turns off what this file makes fast: the
// memo, the matcher's last model, and the scans' skipping of nodes with no
// more free GPUs than the best so far (hold.go closest, plan.go explain),
// the memo of team notes (teamnotes.go), and the searches for fractions
// and MIG devices passing over the nodes that have none (plan.go nodesOf,
// snapshot.go lacksKind, best's gpusFit).
// The test plans randomized snapshots both ways and requires equal plans.
var modelScanReference bool

// modelMatchKey is one (pattern, model) pair.
type modelMatchKey struct{ pattern, model string }

// modelMatchCap bounds the memo: past it the memo is emptied and fills
// again, so that patterns from many requests over a placer's life cannot
// grow it without end.
const modelMatchCap = 4096

var (
	modelMatchMemo sync.Map // modelMatchKey → bool
	modelMatchSize atomic.Int64
)

// modelMatches reports whether model matches the shell pattern pattern
// (path.Match; a malformed pattern matches nothing). A pure function of
// its arguments: the memo changes no answer, only its cost.
func modelMatches(pattern, model string) bool {
	if modelScanReference {
		ok, err := path.Match(pattern, model)
		return ok && err == nil
	}
	k := modelMatchKey{pattern, model}
	if v, ok := modelMatchMemo.Load(k); ok {
		return v.(bool)
	}
	ok, err := path.Match(pattern, model)
	ok = ok && err == nil
	if modelMatchSize.Add(1) > modelMatchCap {
		modelMatchMemo.Clear()
		modelMatchSize.Store(1)
	}
	modelMatchMemo.Store(k, ok)
	return ok
}

// modelMatcher matches one pattern against many devices' models, as a
// scan over every node does: it remembers the last model it saw, so that
// a run of devices of one model (a node's GPUs, nodes of one kind) costs
// a string comparison each instead of a lookup in the memo.
type modelMatcher struct {
	pattern   string
	lastModel string
	lastOK    bool
	seen      bool
}

// match reports whether model matches m's pattern (modelMatches).
func (m *modelMatcher) match(model string) bool {
	if modelScanReference {
		return modelMatches(m.pattern, model)
	}
	if m.seen && model == m.lastModel {
		return m.lastOK
	}
	m.lastModel, m.lastOK, m.seen = model, modelMatches(m.pattern, model), true
	return m.lastOK
}
