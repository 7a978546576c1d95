package api

import (
	"fmt"
	"time"

	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
)

// ElasticRequest asks that a batch job run at any size from Min to Max
// GPUs on one machine (SessionRequest.Elastic): the placer starts it at
// the largest size fair share allows, at least Min, and grows or shrinks
// it with the cluster's load, each resize a restart at the new size
// (docs/api.md, "Elastic jobs").
//
// MinNodes and MaxNodes ask instead that a multi-node batch job run on any
// number of machines from MinNodes to MaxNodes, one part of the request's
// resources on each (elastic_nodes.go).
type ElasticRequest struct {
	Min      int `json:"min,omitempty"`
	Max      int `json:"max,omitempty"`
	MinNodes int `json:"minNodes,omitempty"`
	MaxNodes int `json:"maxNodes,omitempty"`
}

// validateElastic checks req's range against spec s (built without it)
// and records it in s: Resources.GPUs becomes Min. A range of one size
// (Min = Max) is a fixed-size job.
func validateElastic(req *ElasticRequest, s *state.Session, add func(field, format string, args ...any)) {
	if req == nil || req.byNodes() {
		return // a range of machines: validateElasticNodes
	}
	bad := len(fieldErrs(func(add func(string, string, ...any)) {
		switch {
		case req.Min < 1:
			add("elastic.min", "got %d, want at least 1 GPU", req.Min)
		case req.Max < req.Min:
			add("elastic.max", "got %d, below elastic.min %d; want min ≤ max, e.g. {\"min\": 2, \"max\": 8}", req.Max, req.Min)
		case req.Max > maxGPUs:
			add("elastic.max", "got %d, want at most %d GPUs", req.Max, maxGPUs)
		}
		switch {
		case s.Kind != state.KindBatch:
			add("elastic", "applies to batch jobs only (kind \"batch\"): a notebook keeps the GPUs it started with")
		case s.Nodes > 1:
			add("elastic", "a range of GPUs runs on one machine; for a multi-node job that resizes ask for a range of nodes instead, {\"minNodes\": 1, \"maxNodes\": %d} with resources for each machine", s.Nodes)
		case s.Ray != nil && s.Ray.Workers > 0:
			add("elastic", "applies to batch jobs on one machine, not to Ray sessions")
		case s.Resources.MIGProfile != "" || s.Resources.GPUShareMiB != 0:
			add("elastic", "is a range of whole GPUs; leave out resources.migProfile and resources.gpuShareMiB")
		case s.Resources.GPUs != 0 && s.Resources.GPUs != req.Min:
			add("resources.gpus", "got %d with elastic %d-%d: leave it out (an elastic job needs elastic.min GPUs at the least) or set it to elastic.min", s.Resources.GPUs, req.Min, req.Max)
		}
	}, add)) > 0
	if bad {
		return
	}
	s.Resources.GPUs = req.Min
	if req.Min == req.Max {
		return // one size: a fixed-size job
	}
	s.Elastic = &state.Elastic{Min: req.Min, Max: req.Max}
}

// fieldErrs runs check with an add that passes each error on to add, and
// returns them.
func fieldErrs(check func(add func(string, string, ...any)), add func(string, string, ...any)) []string {
	var fields []string
	check(func(field, format string, args ...any) {
		fields = append(fields, field)
		add(field, format, args...)
	})
	return fields
}

// elasticFeasibility refuses an elastic job whose maximum no node could
// ever hold (its minimum is checked as every request is), with the most
// a node holds.
func elasticFeasibility(s state.Session, nodes []state.Node, plan placer.PlanOptions, now time.Time) []FieldError {
	if s.Elastic == nil || len(nodes) == 0 {
		return nil
	}
	if s.Elastic.ByNodes() {
		return elasticNodesFeasibility(s, nodes, plan, now)
	}
	at := s
	at.Elastic, at.Resources.GPUs = nil, s.Elastic.Max
	errs := feasibility(at, nodes, plan, now)
	if len(errs) == 0 {
		return nil
	}
	most := 0
	for n := s.Elastic.Max - 1; n >= s.Elastic.Min; n-- {
		at.Resources.GPUs = n
		if len(feasibility(at, nodes, plan, now)) == 0 {
			most = n
			break
		}
	}
	return []FieldError{{Field: "elastic.max", Message: fmt.Sprintf("got %d, but no node can ever hold %d GPUs of this request (%s); want elastic.max at most %d",
		s.Elastic.Max, s.Elastic.Max, errs[0].Message, most)}}
}
