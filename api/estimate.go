package api

import (
	"fmt"
	"path"
	"sort"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// QueueEstimate is when one of the caller's waiting sessions could start,
// from the max runtimes of the sessions that hold the GPUs it needs.
type QueueEstimate struct {
	// At is the earliest moment enough matching GPUs are free on one node
	// if every session holding them runs to its max runtime; nil when that
	// cannot be estimated (Message says why). It does not count sessions
	// ahead in the queue, which may take those GPUs first, nor CPU,
	// memory or quota: it is a lower bound in that sense.
	At *time.Time `json:"at,omitempty"`
	// Message says how At was found, or why there is none.
	Message string `json:"message"`
}

// estimator answers estimates for the waiting sessions of one queue view,
// from the caches alone: the holders' max runtimes come from the runtimes
// cache, looked up once, on first need.
type estimator struct {
	a     *API
	now   time.Time
	nodes []estNode
	ends  map[string]*time.Time // session id → when its max runtime ends; nil: never
	read  bool
}

type estNode struct {
	name    string
	devices []GPUDevice
}

func (a *API) newEstimator() *estimator {
	e := &estimator{a: a, now: a.cfg.Now()}
	ledgers, cordons, statuses := a.ledgers.Snapshot(), a.cordons.Snapshot(), a.status.Snapshot()
	all := Principal{Admin: true}
	for _, n := range a.liveNodes() {
		if _, cordoned := cordons.Get(a.keys.Cordon(n.Name)); cordoned {
			continue
		}
		l, _ := ledgers.Get(a.keys.Ledger(n.Name))
		e.nodes = append(e.nodes, estNode{name: n.Name, devices: nodeDevices(all, n, l, func(id string) (state.Status, bool) {
			return statuses.Get(a.keys.Status(id))
		})})
	}
	return e
}

func estMatches(d GPUDevice, r state.Resources) bool {
	if !d.Healthy || d.MIGProfile != r.MIGProfile || (r.GPUMemoryMiB > 0 && d.MemoryMiB < r.GPUMemoryMiB) {
		return false
	}
	if r.GPUModel != "" {
		if ok, err := path.Match(r.GPUModel, d.Model); err != nil || !ok {
			return false
		}
	}
	return true
}

// sessionLimits is the part of a session spec the estimates need.
type sessionLimits struct {
	Limits state.Limits `json:"limits"`
	// What usage.go charges a running attempt to: its owner, team and
	// GPUs (liveUsage).
	usageFields
}

// readEnds finds when every session that holds a device reaches its max
// runtime, from the runtimes cache (a spec not in it yet counts as one with
// no limit).
func (e *estimator) readEnds() {
	if e.read {
		return
	}
	e.read = true
	e.ends = map[string]*time.Time{}
	statuses, limits := e.a.status.Snapshot(), e.a.runtimes.Snapshot()
	for _, n := range e.nodes {
		for _, d := range n.devices {
			id := d.Session
			if id == "" {
				continue
			}
			if _, done := e.ends[id]; done {
				continue
			}
			sl, ok := limits.Get(e.a.keys.Session(id))
			if !ok {
				e.ends[id] = nil
				continue
			}
			limit := e.a.effectiveMaxRuntime(state.Session{Limits: sl.Limits})
			if limit <= 0 {
				e.ends[id] = nil
				continue
			}
			// Not started yet (bound, starting): it cannot end later than
			// its limit from now.
			from := e.now
			if st, ok := statuses.Get(e.a.keys.Status(id)); ok && st.Started != nil {
				from = *st.Started
			}
			end := from.Add(limit)
			e.ends[id] = &end
		}
	}
}

// estimate answers for a waiting entry q at queue position pos.
func (e *estimator) estimate(q state.QueueEntry, pos int) *QueueEstimate {
	parts := q.Parts()
	if len(parts) > 1 {
		return &QueueEstimate{Message: "cannot be estimated: a Ray session with workers needs several nodes at once"}
	}
	r := parts[0]
	if r.GPUs == 0 {
		return &QueueEstimate{Message: "cannot be estimated: it needs no GPU, and only GPU holders' max runtimes are counted"}
	}
	e.readEnds()
	var best *time.Time
	unknown := 0
	for _, n := range e.nodes {
		free := 0
		holders := map[string]int{}
		for _, d := range n.devices {
			if !estMatches(d, r) {
				continue
			}
			if d.Session == "" && d.Owner == "" {
				free++
			} else {
				holders[d.Session]++
			}
		}
		if free+sum(holders) < r.GPUs {
			continue // this node can never hold it
		}
		if free >= r.GPUs {
			now := e.now
			best = &now
			break
		}
		type rel struct {
			at time.Time
			n  int
		}
		var rels []rel
		for id, k := range holders {
			if end := e.ends[id]; end != nil {
				rels = append(rels, rel{*end, k})
			} else {
				unknown++
			}
		}
		sort.Slice(rels, func(i, j int) bool { return rels[i].at.Before(rels[j].at) })
		for _, x := range rels {
			if free += x.n; free >= r.GPUs {
				if best == nil || x.at.Before(*best) {
					at := x.at
					best = &at
				}
				break
			}
		}
	}
	ahead := ""
	if pos > 1 {
		ahead = fmt.Sprintf("; %d sessions ahead may take them first", pos-1)
	}
	switch {
	case best != nil && !best.After(e.now):
		return &QueueEstimate{At: best, Message: fmt.Sprintf("%d matching GPUs are free now: it waits for something else (its reason says what)%s", r.GPUs, ahead)}
	case best != nil:
		return &QueueEstimate{At: best, Message: fmt.Sprintf("by %s at the latest the sessions holding enough GPUs reach their max runtime%s", best.UTC().Format("2006-01-02 15:04 UTC"), ahead)}
	case unknown > 0:
		return &QueueEstimate{Message: "cannot be estimated: the GPUs it needs are held by sessions with no max runtime"}
	default:
		return &QueueEstimate{Message: "cannot be estimated: no live, uncordoned node has enough matching GPUs"}
	}
}

func sum(m map[string]int) int {
	t := 0
	for _, v := range m {
		t += v
	}
	return t
}
