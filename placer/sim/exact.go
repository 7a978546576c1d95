package sim

import (
	"fmt"
	"strconv"
	"strings"
)

// profile is the GPUs in use on each node at each pass of an instance,
// as jobs are added to a schedule one at a time.
type profile struct {
	in   *Instance
	used [][]int
}

func newProfile(in *Instance) *profile {
	p := &profile{in: in, used: make([][]int, in.Nodes)}
	for n := range p.used {
		p.used[n] = make([]int, in.Passes)
	}
	return p
}

// earliest is the first pass at or after from at which g GPUs are free on
// node n for d passes (or to the end of the run), or -1 if none is.
func (p *profile) earliest(n, from, g, d int) int {
	row, room := p.used[n], p.in.GPUsPerNode-g
	for k := from; k < p.in.Passes; {
		ok := true
		for t := k; t < min(k+d, p.in.Passes); t++ {
			if row[t] > room {
				k, ok = t+1, false // no start before t+1 covers pass t
				break
			}
		}
		if ok {
			return k
		}
	}
	return -1
}

// common is the first pass at or after from at which job j's parts fit on
// every node of nodes, or -1.
func (p *profile) common(j *Job, nodes []int, from int) int {
	k := from
	for {
		moved := false
		for _, n := range nodes {
			e := p.earliest(n, k, j.GPUs, j.Dur)
			if e < 0 {
				return -1
			}
			if e > k {
				k, moved = e, true
			}
		}
		if !moved {
			return k
		}
	}
}

// anyStart is the first pass at or after job j's release at which some
// Parts distinct nodes all fit it, or -1; fit, if not nil, receives the
// nodes that fit then, in index order.
func (p *profile) anyStart(j *Job, fit *[]int) int {
	k := j.Release
	for k >= 0 && k < p.in.Passes {
		next, count := -1, 0
		if fit != nil {
			*fit = (*fit)[:0]
		}
		for n := 0; n < p.in.Nodes; n++ {
			e := p.earliest(n, k, j.GPUs, j.Dur)
			if e == k {
				count++
				if fit != nil {
					*fit = append(*fit, n)
				}
			} else if e > k && (next < 0 || e < next) {
				next = e
			}
		}
		if count >= j.Parts {
			return k
		}
		if next < 0 {
			return -1
		}
		k = next
	}
	return -1
}

func (p *profile) add(j *Job, nodes []int, k, sign int) {
	if k < 0 {
		return
	}
	for _, n := range nodes {
		for t := k; t < min(k+j.Dur, p.in.Passes); t++ {
			p.used[n][t] += sign * j.GPUs
		}
	}
}

// sameRow reports whether nodes a and b have the same use at every pass.
func (p *profile) sameRow(a, b int) bool {
	ra, rb := p.used[a], p.used[b]
	for t := range ra {
		if ra[t] != rb[t] {
			return false
		}
	}
	return true
}

// ExactLimit is the most jobs Exact accepts: its search grows with the
// factorial of the jobs.
const ExactLimit = 9

// Exact is a branch and bound over every order in which the jobs can be
// scheduled and every choice of nodes for each, each job started at the
// first pass its nodes fit it on what the jobs before it left (a serial
// schedule-generation scheme: the schedules it generates are the active
// schedules, in which no job can start earlier without delaying another;
// every schedule optimal on waits is active, since waits only grow with
// starts). It returns the schedule that is best lexicographically on
// (Wait, Machines, Stranded) among the feasible ones: exact on waits, and on
// machines and stranded GPUs among the schedules of least wait.
// TestExactMatchesEnumeration checks it against every schedule of small
// instances.
//
// Bounds: a job not yet placed starts no earlier than where it fits on
// the nodes as they are now (placing more jobs only takes capacity), so
// the waits placed plus those earliest waits bound a branch from below,
// and a job whose earliest start already breaks its fair-share slack ends
// it. A partial schedule reached by two orders is searched once; nodes
// whose use is the same at every pass are interchangeable, and only the
// first of them is tried.
func (in *Instance) Exact() (Schedule, Objectives, error) {
	nj := len(in.Jobs)
	if nj > ExactLimit {
		return Schedule{}, Objectives{}, fmt.Errorf("solve exactly: %d jobs, more than %d", nj, ExactLimit)
	}
	var (
		prof     = newProfile(in)
		cur      = Schedule{Start: make([]int, nj), Nodes: make([][]int, nj)}
		placed   = make([]bool, nj)
		best     Schedule
		bestObj  Objectives
		found    bool
		seen     = map[string]bool{}
		fitNodes []int
	)
	key := func() string {
		var b strings.Builder
		for j := range in.Jobs {
			if !placed[j] {
				b.WriteString("_;")
				continue
			}
			b.WriteString(strconv.Itoa(cur.Start[j]))
			for _, n := range cur.Nodes[j] {
				b.WriteByte(',')
				b.WriteString(strconv.Itoa(n))
			}
			b.WriteByte(';')
		}
		return b.String()
	}
	var rec func(depth int, sumWait float64)
	rec = func(depth int, sumWait float64) {
		k := key()
		if seen[k] {
			return
		}
		seen[k] = true
		if depth == nj {
			o := Objectives{Wait: sumWait / float64(max(nj, 1))}
			o.Machines, o.Stranded = in.occupancy(cur, prof.used)
			if !found || o.Less(bestObj) {
				found, bestObj = true, o
				best = Schedule{Start: append([]int(nil), cur.Start...), Nodes: make([][]int, nj)}
				for j := range cur.Nodes {
					best.Nodes[j] = append([]int(nil), cur.Nodes[j]...)
				}
			}
			return
		}
		lb := sumWait
		for j := range in.Jobs {
			if placed[j] {
				continue
			}
			jb := &in.Jobs[j]
			e := prof.anyStart(jb, nil)
			if e < 0 && !in.unstartedFair(jb) {
				return
			}
			if e >= 0 {
				if l := in.latest(jb); l >= 0 && l < in.Passes && e > l {
					return
				}
			}
			lb += in.waitOf(jb, e)
		}
		if found && lb/float64(nj) > bestObj.Wait+1e-9 {
			return
		}
		for j := range in.Jobs {
			if placed[j] {
				continue
			}
			jb := &in.Jobs[j]
			triedUnstarted := false
			for _, nodes := range in.nodeSets(prof, jb.Parts, &fitNodes) {
				k := prof.common(jb, nodes, jb.Release)
				if k < 0 {
					if triedUnstarted || !in.unstartedFair(jb) {
						continue
					}
					triedUnstarted = true
					nodes = nil
				} else if l := in.latest(jb); l < 0 || (l < in.Passes && k > l) {
					continue
				}
				placed[j], cur.Start[j], cur.Nodes[j] = true, k, nodes
				prof.add(jb, nodes, k, 1)
				rec(depth+1, sumWait+in.waitOf(jb, k))
				prof.add(jb, nodes, k, -1)
				placed[j], cur.Start[j], cur.Nodes[j] = false, 0, nil
			}
		}
	}
	rec(0, 0)
	if !found {
		return Schedule{}, Objectives{}, fmt.Errorf("solve exactly: no schedule keeps every job within its fair-share slack: %w", ErrInfeasible)
	}
	return best, bestObj, nil
}

// nodeSets lists the sets of parts distinct nodes to try, leaving out a
// node whose use equals an earlier node's at every pass (interchangeable).
func (in *Instance) nodeSets(prof *profile, parts int, scratch *[]int) [][]int {
	distinct := (*scratch)[:0]
	for n := 0; n < in.Nodes; n++ {
		dup := 0
		for _, m := range distinct {
			if prof.sameRow(m, n) {
				dup++
			}
		}
		// Of interchangeable nodes, keep as many as a gang could use.
		if dup < parts {
			distinct = append(distinct, n)
		}
	}
	*scratch = distinct
	var out [][]int
	var pick func(from int, acc []int)
	pick = func(from int, acc []int) {
		if len(acc) == parts {
			out = append(out, append([]int(nil), acc...))
			return
		}
		for i := from; i < len(distinct); i++ {
			pick(i+1, append(acc, distinct[i]))
		}
	}
	pick(0, nil)
	return out
}
