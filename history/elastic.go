package history

import (
	"fmt"
	"sort"

	"github.com/voyager-gpu/voyager/state"
)

// RuleElasticOverSize: an elastic job holds more GPUs, over all the nodes
// involved (ledger allocations and bindings), than the size its current
// attempt was bound at (Status.Elastic.Size, written by the bind in the
// same transaction as the allocations), or than its maximum. A resize is
// a restart: the old size is released before the new one is bound, so at
// no revision does a job hold both. A job over a range of machines is
// held to its count too: it holds parts (ledger allocations, bindings) on
// no more nodes than its status's Elastic.Nodes (or MaxNodes), and no
// more GPUs over them than Elastic.Size, the GPUs of those parts.
const RuleElasticOverSize = "elastic-over-size"

// elasticOver checks the elastic jobs among ids (sorted for a stable
// report): for each, what its ledgers and its bindings hold against its
// status's size.
func (c *Checker) elasticOver(ids map[string]bool) [][2]string {
	var out [][2]string
	sorted := make([]string, 0, len(ids))
	for id := range ids {
		if st, ok := c.statuses[id]; ok && st.Elastic != nil {
			sorted = append(sorted, id)
		}
	}
	sort.Strings(sorted)
	for _, id := range sorted {
		el := c.statuses[id].Elastic
		held, bound := 0, 0
		for node := range c.holds[id] {
			held += len(c.ledgers[node].Allocations[id].GPUs)
			bound += len(c.bound[[2]string{node, id}].gpus)
		}
		limit, what := el.Size, fmt.Sprintf("its size %d", el.Size)
		if !el.ByNodes() && (limit <= 0 || limit > el.Max) {
			limit, what = el.Max, fmt.Sprintf("its maximum %d", el.Max)
		}
		if el.ByNodes() {
			if v, bad := nodesOver(id, el, c.holds[id]); bad {
				out = append(out, [2]string{id, v})
				continue
			}
			if el.Size <= 0 {
				continue // no GPU count to hold it to
			}
		}
		if held > limit || bound > limit {
			out = append(out, [2]string{id, fmt.Sprintf("elastic job %s (%s) holds %d GPUs in ledgers and %d in bindings, above %s",
				id, el.Range(el.Current()), held, bound, what)})
		}
	}
	return out
}

// nodesOver checks the node count of elastic job id over a range of
// machines: on how many nodes it has a binding (bit 1 of holds) and a
// ledger allocation (bit 2), against its status's count.
func nodesOver(id string, el *state.Elastic, holds map[string]uint8) (string, bool) {
	limit, what := el.Nodes, fmt.Sprintf("its count %d", el.Nodes)
	if limit <= 0 || limit > el.MaxNodes {
		limit, what = el.MaxNodes, fmt.Sprintf("its maximum %d", el.MaxNodes)
	}
	inBindings, inLedgers := 0, 0
	for _, bits := range holds {
		if bits&1 != 0 {
			inBindings++
		}
		if bits&2 != 0 {
			inLedgers++
		}
	}
	if inLedgers > limit || inBindings > limit {
		return fmt.Sprintf("elastic job %s (%s) holds parts on %d nodes in ledgers and %d in bindings, above %s",
			id, el.Range(el.Nodes), inLedgers, inBindings, what), true
	}
	return "", false
}
