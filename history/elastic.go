package history

import (
	"fmt"
	"sort"
)

// RuleElasticOverSize: an elastic job holds more GPUs, over all the nodes
// involved (ledger allocations and bindings), than the size its current
// attempt was bound at (Status.Elastic.Size, written by the bind in the
// same transaction as the allocations), or than its maximum. A resize is
// a restart: the old size is released before the new one is bound, so at
// no revision does a job hold both.
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
		if limit <= 0 || limit > el.Max {
			limit, what = el.Max, fmt.Sprintf("its maximum %d", el.Max)
		}
		if held > limit || bound > limit {
			out = append(out, [2]string{id, fmt.Sprintf("elastic job %s (%s) holds %d GPUs in ledgers and %d in bindings, above %s",
				id, el.Range(el.Size), held, bound, what)})
		}
	}
	return out
}
