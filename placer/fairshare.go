package placer

import (
	"fmt"

	"github.com/voyager-gpu/voyager/state"
)

// amounts are resources held or asked for: GPUs in thousandths (a
// fraction counts as its share of a GPU, share.go), CPU in milli-cores,
// memory in MiB.
type amounts struct{ gpus, cpu, mem int64 }

func (a *amounts) addReq(r *state.Resources, shareRef int64) {
	a.gpus += milliGPUs(r, shareRef)
	a.cpu += r.CPUMilli
	a.mem += r.MemoryMiB
}

// usage is what each owner and group holds: ledgers plus this pass's plan.
type usage struct {
	total  amounts
	users  map[string]*amounts
	groups map[string]*amounts
	// shareRef is the memory of the cluster's largest shared GPU: what a
	// fraction not yet bound counts against (milliGPUs).
	shareRef int64
}

// newUsage is what the nodes' ledgers hold, less what pinned sessions
// hold (counted at their turn).
func newUsage(nodes []*nodeState, pinned map[string][]pinnedPart) usage {
	u := usage{users: map[string]*amounts{}, groups: map[string]*amounts{}, shareRef: sharedRefMiB(nodes)}
	for _, n := range nodes {
		u.total.gpus += 1000 * int64(n.totalGPU)
		u.total.cpu += n.view.Node.CPUMilli
		u.total.mem += n.view.Node.MemoryMiB
		if h := n.ledgerSums(); h != nil && len(pinned) == 0 {
			for i := range h.owners {
				u.get(u.users, h.owners[i].owner).plus(h.owners[i].held)
			}
			for i := range h.groups {
				u.get(u.groups, h.groups[i].group).plus(h.groups[i].held)
			}
			continue
		}
		for id, a := range n.view.Ledger.Allocations {
			if pinned[id] == nil {
				u.addAllocation(&a)
			}
		}
	}
	return u
}

// addAllocation counts what a holds in its owner's and groups' usage.
func (u *usage) addAllocation(a *state.Allocation) {
	add := amounts{a.MilliGPUs(), a.CPUMilli, a.MemoryMiB}
	u.get(u.users, a.Owner).plus(add)
	for _, g := range a.Groups {
		u.get(u.groups, g).plus(add)
	}
}

func (a *amounts) plus(b amounts) { a.gpus += b.gpus; a.cpu += b.cpu; a.mem += b.mem }

func (u *usage) get(m map[string]*amounts, k string) *amounts {
	a, ok := m[k]
	if !ok {
		a = &amounts{}
		m[k] = a
	}
	return a
}

func (u *usage) add(e *state.QueueEntry, reqs []state.Resources) {
	var sum amounts
	for i := range reqs {
		sum.addReq(&reqs[i], u.shareRef)
	}
	u.get(u.users, e.Owner).plus(sum)
	for _, g := range e.Groups {
		u.get(u.groups, g).plus(sum)
	}
}

// share is the dominant resource share of the cluster that a (a user's
// or a group's holding; nil: nothing) amounts to.
func (u *usage) share(a *amounts) float64 {
	if a == nil {
		return 0
	}
	s := 0.0
	if u.total.gpus > 0 {
		s = max(s, float64(a.gpus)/float64(u.total.gpus))
	}
	if u.total.cpu > 0 {
		s = max(s, float64(a.cpu)/float64(u.total.cpu))
	}
	if u.total.mem > 0 {
		s = max(s, float64(a.mem)/float64(u.total.mem))
	}
	return s
}

// quotaRef names one quota that a decision depends on: the owner's or one
// of its groups'. The bind transaction guards each (state.QuotaGuard).
type quotaRef struct {
	scope state.QuotaScope
	name  string
}

// quotaScopes lists the quotas of s that e's placement is checked against.
func quotaScopes(e *state.QueueEntry, s *Snapshot) []quotaRef {
	var out []quotaRef
	if _, ok := s.UserQuotas[e.Owner]; ok {
		out = append(out, quotaRef{state.QuotaUsers, e.Owner})
	}
	for _, g := range e.Groups {
		if _, ok := s.GroupQuotas[g]; ok {
			out = append(out, quotaRef{state.QuotaGroups, g})
		}
	}
	if e.Team != "" && len(s.Teams.Teams) > 0 {
		out = appendTeamScopes(out, e.Team, s) // teams.go
	}
	return out
}

// quotaAllows checks e, needing need in all, against its owner's and
// groups' quotas.
func (u *usage) quotaAllows(e *state.QueueEntry, need amounts, s *Snapshot) (string, string, bool) {
	check := func(kind, name string, q state.Quota, held *amounts) (string, bool) {
		var h amounts
		if held != nil {
			h = *held
		}
		for _, c := range []struct {
			what        string
			limit       *int64
			held, needs int64
			unit        string
			scale       int64 // held and needs per unit of limit
		}{
			{"GPUs", q.GPUs, h.gpus, need.gpus, "", 1000},
			{"CPU", q.CPUMilli, h.cpu, need.cpu, " milli-cores", 1},
			{"memory", q.MemoryMiB, h.mem, need.mem, " MiB", 1},
		} {
			if c.limit != nil && c.needs > 0 && c.held+c.needs > *c.limit*c.scale {
				return fmt.Sprintf("over the %s quota of %s %s: %s%s %s held of %d allowed; this needs %s more",
					c.what, kind, name, scaled(c.held, c.scale), c.unit, c.what, *c.limit, scaled(c.needs, c.scale)), false
			}
		}
		return "", true
	}
	if q, ok := s.UserQuotas[e.Owner]; ok {
		if msg, ok := check("user", e.Owner, q, u.users[e.Owner]); !ok {
			return "Quota", msg, false
		}
	}
	for _, g := range e.Groups {
		if q, ok := s.GroupQuotas[g]; ok {
			if msg, ok := check("group", g, q, u.groups[g]); !ok {
				return "Quota", msg, false
			}
		}
	}
	return "", "", true
}
