package nodeagent

import (
	"strconv"

	"github.com/voyager-gpu/voyager/state"
)

// elasticEnv is the environment of an elastic job's container (none for
// other sessions): its size, the GPUs it was bound with, as the world
// torchrun --standalone --nproc-per-node=$VOYAGER_GPUS makes (one process
// per GPU on one machine), and its range. A resize restarts the job with
// these at the new size; VOYAGER_RESIZES above 0 tells it to resume from
// its checkpoint.
//
// A multi-node job over a range of machines gets its range and resizes
// here; its world (WORLD_SIZE, NNODES, NODE_RANK, MASTER_ADDR) is the
// parts of its current attempt, from JobEnv.
func elasticEnv(s state.Session, b state.Binding) map[string]string {
	el := s.Elastic
	if el == nil {
		return nil
	}
	if el.ByNodes() {
		return map[string]string{
			"VOYAGER_ELASTIC_MIN_NODES": strconv.Itoa(el.MinNodes),
			"VOYAGER_ELASTIC_MAX_NODES": strconv.Itoa(el.MaxNodes),
			"VOYAGER_RESIZES":           strconv.Itoa(el.Resizes),
		}
	}
	if s.Gang() {
		return nil
	}
	n := strconv.Itoa(len(b.GPUs))
	return map[string]string{
		"VOYAGER_GPUS":        n,
		"VOYAGER_ELASTIC_MIN": strconv.Itoa(el.Min),
		"VOYAGER_ELASTIC_MAX": strconv.Itoa(el.Max),
		"VOYAGER_RESIZES":     strconv.Itoa(el.Resizes),
		"WORLD_SIZE":          n,
		"NPROC_PER_NODE":      n,
		"PET_NPROC_PER_NODE":  n,
		"NNODES":              "1",
		"PET_NNODES":          "1",
		"NODE_RANK":           "0",
		"GROUP_RANK":          "0",
		"PET_NODE_RANK":       "0",
	}
}
