package sim

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// The optimum to measure the planner against (issue 40). A run of the
// simulator fixes an arrival sequence; an Instance is that sequence on the
// pass grid, and a Schedule gives each session a pass to start at and the
// nodes of its parts. Three objectives, all minimised:
//
//   - Wait: the mean wait, in minutes, from arrival to the pass that
//     starts a session (still waiting at the end: counted with its wait so
//     far), as Result.Wait measures it;
//   - Machines: the mean, over passes, of nodes holding at least one
//     session (nodes that could not be powered down);
//   - Stranded: the mean, over passes, of free GPUs on nodes whose free
//     GPUs are fewer than the smallest part any waiting session asks for:
//     idle GPUs the queue cannot use because they are split across nodes.
//
// Fair share is a constraint, not an objective: every session's wait beyond
// the wait its user's fair share implied at its arrival (Placed.FairWait,
// as Result.MaxExcess measures it) is at most Instance.Slack. An instance
// made from a run takes the run's own worst excess as the slack, so the
// optimum is held to be at least as fair, by the suite's own measure, as
// the planner it is compared with, and the planner's schedule is always a
// feasible point.

// Job is one session of an Instance.
type Job struct {
	ID, User string
	// GPUs on each of Parts parts; parts go on distinct nodes.
	GPUs, Parts int
	// Arrive is when it arrived; Release the first pass it may start at.
	Arrive  time.Duration
	Release int
	// Dur is how many passes it holds its GPUs: a session that starts at
	// pass k frees them at pass k+Dur.
	Dur int
	// FairWait is the wait, in minutes, its fair share implied.
	FairWait float64
	// Limit is its declared max runtime (zero: none): what an online
	// planner knows of Dur.
	Limit time.Duration
}

// Instance is an arrival sequence on a cluster of identical nodes, planned
// in passes Tick apart up to End.
type Instance struct {
	Nodes, GPUsPerNode int
	Tick               time.Duration
	// Passes is the number of passes (the first at time zero); a session
	// not started by the last is counted as waiting until End.
	Passes int
	End    time.Duration
	Jobs   []Job
	// Slack bounds, in minutes, every job's wait beyond its FairWait.
	Slack float64
}

// Schedule places an Instance: Start[j] is job j's pass (-1: not started
// within the run) and Nodes[j] the nodes of its parts.
type Schedule struct {
	Start []int
	Nodes [][]int
}

// Objectives are a schedule's three objectives (see the package comment
// of optimum.go); lower is better on each.
type Objectives struct {
	Wait, Machines, Stranded float64
}

// Less orders objectives lexicographically: waits first, then machines,
// then stranded GPUs (each equal within 1e-9).
func (o Objectives) Less(p Objectives) bool {
	const eps = 1e-9
	switch {
	case math.Abs(o.Wait-p.Wait) > eps:
		return o.Wait < p.Wait
	case math.Abs(o.Machines-p.Machines) > eps:
		return o.Machines < p.Machines
	}
	return o.Stranded < p.Stranded-eps
}

// dominates reports whether o is no worse than p on every objective and
// better on one.
func (o Objectives) dominates(p Objectives) bool {
	return o.Wait <= p.Wait && o.Machines <= p.Machines && o.Stranded <= p.Stranded &&
		(o.Wait < p.Wait || o.Machines < p.Machines || o.Stranded < p.Stranded)
}

func (o Objectives) vec() [3]float64 { return [3]float64{o.Wait, o.Machines, o.Stranded} }

// ErrInfeasible is wrapped by Evaluate's errors for a schedule that breaks
// a constraint.
var ErrInfeasible = errors.New("infeasible schedule")

// NewInstance is the instance of a run made with Config.Record: the
// sessions that arrived by its last pass, each released at the first pass
// at or after its arrival and holding its GPUs for its run time rounded up
// to whole passes (the simulator frees them at the first pass at or after
// the end), with the run's worst wait beyond fair share as the slack; and
// the planner's schedule of it.
func NewInstance(cfg Config, res Result) (*Instance, Schedule, error) {
	if len(res.Schedule) == 0 && res.Sessions > 0 {
		return nil, Schedule{}, fmt.Errorf("make instance: the run has no schedule (set Config.Record)")
	}
	if cfg.NodeGPUs != nil {
		return nil, Schedule{}, fmt.Errorf("make instance: nodes of several sizes (Config.NodeGPUs) are not modelled by the optimiser")
	}
	tick := cfg.Tick
	if tick <= 0 {
		tick = time.Minute
	}
	gpus := cfg.GPUsPerNode
	if gpus <= 0 {
		gpus = 8
	}
	in := &Instance{Nodes: cfg.Nodes, GPUsPerNode: gpus, Tick: tick, Passes: res.Passes, End: cfg.Duration, Slack: math.Max(res.MaxExcess, 0) + 1e-6}
	var sch Schedule
	for _, p := range res.Schedule {
		release := int((p.Arrive + tick - 1) / tick)
		if release >= in.Passes {
			continue // never planned: the simulator does not count it either
		}
		dur := max(1, int((p.Runtime+tick-1)/tick))
		in.Jobs = append(in.Jobs, Job{ID: p.ID, User: p.User, GPUs: p.GPUs, Parts: p.Parts, Arrive: p.Arrive, Release: release, Dur: dur, FairWait: p.FairWait, Limit: p.Limit})
		sch.Start = append(sch.Start, p.Pass)
		sch.Nodes = append(sch.Nodes, p.Nodes)
	}
	return in, sch, nil
}

// waitOf is job j's wait in minutes if it starts at pass k (-1: never).
func (in *Instance) waitOf(j *Job, k int) float64 {
	if k < 0 || k >= in.Passes {
		return (in.End - j.Arrive).Minutes()
	}
	return (time.Duration(k)*in.Tick - j.Arrive).Minutes()
}

// latest is the last pass job j may start at within its fair-share slack
// (in.Passes or more: no bound within the run), or -1 if even starting at
// its release breaks it. A job left unstarted must have End within it.
func (in *Instance) latest(j *Job) int {
	bound := j.Arrive.Minutes() + j.FairWait + in.Slack // latest start, in minutes from zero
	k := int(math.Floor(bound / in.Tick.Minutes()))
	if k < j.Release {
		return -1
	}
	return k
}

// unstartedFair reports whether leaving job j unstarted keeps its slack.
func (in *Instance) unstartedFair(j *Job) bool {
	return in.waitOf(j, -1)-j.FairWait <= in.Slack
}

// Evaluate checks s against every constraint (release, distinct nodes,
// node capacity at every pass, fair-share slack) and returns its
// objectives; a broken constraint is an error wrapping ErrInfeasible that
// names it.
func (in *Instance) Evaluate(s Schedule) (Objectives, error) {
	if len(s.Start) != len(in.Jobs) || len(s.Nodes) != len(in.Jobs) {
		return Objectives{}, fmt.Errorf("evaluate schedule: %d starts and %d placements for %d jobs: %w", len(s.Start), len(s.Nodes), len(in.Jobs), ErrInfeasible)
	}
	used := make([][]int, in.Nodes)
	for n := range used {
		used[n] = make([]int, in.Passes)
	}
	var o Objectives
	for j := range in.Jobs {
		jb, k := &in.Jobs[j], s.Start[j]
		w := in.waitOf(jb, k)
		o.Wait += w
		if w-jb.FairWait > in.Slack+1e-9 {
			return o, fmt.Errorf("evaluate schedule: job %s waits %.1f min, %.1f beyond its fair wait, over the slack %.1f: %w", jb.ID, w, w-jb.FairWait, in.Slack, ErrInfeasible)
		}
		if k < 0 || k >= in.Passes {
			continue
		}
		if k < jb.Release {
			return o, fmt.Errorf("evaluate schedule: job %s starts at pass %d before its release %d: %w", jb.ID, k, jb.Release, ErrInfeasible)
		}
		if len(s.Nodes[j]) != jb.Parts {
			return o, fmt.Errorf("evaluate schedule: job %s has %d parts on %d nodes: %w", jb.ID, jb.Parts, len(s.Nodes[j]), ErrInfeasible)
		}
		seen := map[int]bool{}
		for _, n := range s.Nodes[j] {
			if n < 0 || n >= in.Nodes || seen[n] {
				return o, fmt.Errorf("evaluate schedule: job %s on node %d (twice, or no such node): %w", jb.ID, n, ErrInfeasible)
			}
			seen[n] = true
			for t := k; t < min(k+jb.Dur, in.Passes); t++ {
				used[n][t] += jb.GPUs
				if used[n][t] > in.GPUsPerNode {
					return o, fmt.Errorf("evaluate schedule: node %d holds %d GPUs of %d at pass %d: %w", n, used[n][t], in.GPUsPerNode, t, ErrInfeasible)
				}
			}
		}
	}
	if len(in.Jobs) > 0 {
		o.Wait /= float64(len(in.Jobs))
	}
	o.Machines, o.Stranded = in.occupancy(s, used)
	return o, nil
}

// occupancy is the mean active nodes and stranded GPUs over the passes of
// schedule s, whose GPUs in use are used[node][pass].
func (in *Instance) occupancy(s Schedule, used [][]int) (machines, stranded float64) {
	if in.Passes == 0 {
		return 0, 0
	}
	// The smallest part waiting at each pass: released, not yet started.
	const none = math.MaxInt
	smallest := make([]int, in.Passes)
	for t := range smallest {
		smallest[t] = none
	}
	for j := range in.Jobs {
		jb := &in.Jobs[j]
		until := s.Start[j]
		if until < 0 || until > in.Passes {
			until = in.Passes
		}
		for t := jb.Release; t < until; t++ {
			smallest[t] = min(smallest[t], jb.GPUs)
		}
	}
	for t := 0; t < in.Passes; t++ {
		for n := 0; n < in.Nodes; n++ {
			u := used[n][t]
			if u > 0 {
				machines++
			}
			if free := in.GPUsPerNode - u; free > 0 && smallest[t] != none && free < smallest[t] {
				stranded += float64(free)
			}
		}
	}
	return machines / float64(in.Passes), stranded / float64(in.Passes)
}
