package placer

import (
	"fmt"
	"sort"
	"strings"

	"github.com/voyager-gpu/voyager/state"
)

// A resize is a restart: the job is warned, stopped, released and queued
// again with its cap at the new size. Between its release and its next
// bind it holds nothing on any ledger, so without more its GPUs would look
// idle, and another elastic job on its node could grow into them: a grow
// meant to take a job from 2 GPUs to 6 would leave it with none (issue 40).
//
// So a job whose resize is under way keeps a claim on the node the resize
// was decided on (ElasticJob.Claim, from the spec's Elastic.On, which the
// eviction writes) until it binds again: PlanElastic counts it there at
// its target size, as if it still held the GPUs, unless the plan binds it
// already (then it counts where the plan puts it). A grow of another job
// on that node compares the claimant's spec (Resize.Claims), so a claim
// that ended or changed since the decision refuses the grow.

// addClaims adds to views, for every job of jobs with a claim
// (ElasticJob.Claim) that no view's ledger shows (neither held nor bound
// by the plan), an allocation of up to its target size of the node's free
// whole GPUs, owned as the job is (none for a target of 0). It returns, by
// node, the sessions of those claims, sorted: a grow there compares them.
func addClaims(views map[string]*NodeView, jobs map[string]ElasticJob) map[string][]string {
	var ids []string
	for id, j := range jobs {
		if j.Claim != "" && !j.Nodes {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	sort.Strings(ids)
	present := map[string]bool{}
	for _, v := range views {
		for _, id := range ids {
			if _, ok := v.Ledger.Allocations[id]; ok {
				present[id] = true
			}
		}
	}
	out := map[string][]string{}
	for _, id := range ids {
		j := jobs[id]
		v := views[j.Claim]
		if present[id] || v == nil {
			continue
		}
		out[j.Claim] = append(out[j.Claim], id)
		if j.Target <= 0 {
			continue // compared by a grow there, counted nowhere
		}
		v.Ledger.Allocations[id] = notRunning(state.Allocation{Owner: j.Owner, Groups: j.Groups, Priority: j.Priority,
			Kind: state.KindBatch, Role: state.RoleSingle, Team: j.Team})
		resizeAlloc(v, id, j.Target)
	}
	return out
}

// claimsNote is what a grow's explanation adds for the claims on its node
// that it left alone.
func claimsNote(v *NodeView, claims []string) string {
	if len(claims) == 0 {
		return ""
	}
	var parts []string
	for _, id := range claims {
		if a, ok := v.Ledger.Allocations[id]; ok {
			parts = append(parts, fmt.Sprintf("%d for %s", len(a.GPUs), id))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "; GPUs kept for resizes under way: " + strings.Join(parts, ", ")
}
