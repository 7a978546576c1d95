package api

import (
	"fmt"
	"time"

	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
)

// byNodes reports whether req asks for a range of machines (minNodes,
// maxNodes) rather than of GPUs.
func (req *ElasticRequest) byNodes() bool {
	return req != nil && (req.MinNodes != 0 || req.MaxNodes != 0)
}

// validateElasticNodes checks a range of machines against spec s (built
// without it, its nodes as the request asked) and records it in s:
// s.Nodes becomes MaxNodes, so that validateNodes, run next, checks and
// defaults the multi-node job as for a fixed one. A range of one count
// (MinNodes = MaxNodes) is a fixed multi-node job. limit is the most
// machines one job may have.
func validateElasticNodes(req *ElasticRequest, s *state.Session, limit int, add func(field, format string, args ...any)) {
	if !req.byNodes() {
		return
	}
	bad := len(fieldErrs(func(add func(string, string, ...any)) {
		switch {
		case req.Min != 0 || req.Max != 0:
			add("elastic", "asks for a range of GPUs (min, max) and of nodes (minNodes, maxNodes); want one: {\"min\": 2, \"max\": 8} on one machine, or {\"minNodes\": 1, \"maxNodes\": 4} with resources for each machine")
		case req.MinNodes < 1:
			add("elastic.minNodes", "got %d, want at least 1 machine", req.MinNodes)
		case req.MaxNodes < req.MinNodes:
			add("elastic.maxNodes", "got %d, below elastic.minNodes %d; want minNodes ≤ maxNodes, e.g. {\"minNodes\": 1, \"maxNodes\": 4}", req.MaxNodes, req.MinNodes)
		case req.MaxNodes > limit:
			add("elastic.maxNodes", "got %d, want at most %d: a multi-node job binds every part, each on its own machine, in one etcd transaction (VOYAGER_PLACER_MAX_TXN_OPS)", req.MaxNodes, limit)
		}
		switch {
		case s.Kind != state.KindBatch:
			add("elastic", "applies to batch jobs only (kind \"batch\"): a notebook keeps the machines it started with")
		case s.Ray != nil && s.Ray.Workers > 0:
			add("elastic", "a range of nodes is for a multi-node batch job (torchrun, DeepSpeed, Horovod, MPI), not a Ray cluster, whose workers Voyager does not resize: leave out ray.workers, or elastic")
		case s.Resources.MIGProfile != "" || s.Resources.GPUShareMiB != 0:
			add("elastic", "a range of nodes gives each machine whole GPUs; leave out resources.migProfile and resources.gpuShareMiB")
		case s.Nodes > 1 && s.Nodes != req.MaxNodes:
			add("nodes", "got %d with elastic nodes %d-%d: leave it out (the job runs on elastic.minNodes to elastic.maxNodes machines) or set it to elastic.maxNodes", s.Nodes, req.MinNodes, req.MaxNodes)
		}
	}, add)) > 0
	if bad {
		return
	}
	s.Nodes = req.MaxNodes
	if req.MinNodes == req.MaxNodes {
		return // one count: a fixed multi-node job
	}
	s.Elastic = &state.Elastic{MinNodes: req.MinNodes, MaxNodes: req.MaxNodes}
}

// elasticNodesFeasibility refuses a range of machines whose maximum no
// cluster of these nodes could ever hold (its minimum is checked as every
// request is), with the most machines it could.
func elasticNodesFeasibility(s state.Session, nodes []state.Node, plan placer.PlanOptions, now time.Time) []FieldError {
	el := s.Elastic
	at := s
	at.Elastic = nil
	errs := feasibility(at, nodes, plan, now)
	if len(errs) == 0 {
		return nil
	}
	most := 0
	for n := el.MaxNodes - 1; n >= el.MinNodes; n-- {
		at.Nodes = n
		if n == 1 {
			at.Nodes = 0
		}
		if len(feasibility(at, nodes, plan, now)) == 0 {
			most = n
			break
		}
	}
	return []FieldError{{Field: "elastic.maxNodes", Message: fmt.Sprintf("got %d, but no %d machines can ever hold a part each (%s); want elastic.maxNodes at most %d",
		el.MaxNodes, el.MaxNodes, errs[0].Message, most)}}
}
