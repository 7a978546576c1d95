package api

import (
	"context"
	"fmt"
	"path"
	"sort"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

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
// reading the specs of GPU holders from etcd once, on first need.
type estimator struct {
	a     *API
	ctx   context.Context
	now   time.Time
	nodes []estNode
	ends  map[string]*time.Time // session id → when its max runtime ends; nil: never
	read  bool
	err   error
}

type estNode struct {
	name    string
	devices []GPUDevice
}

func (a *API) newEstimator(ctx context.Context) *estimator {
	e := &estimator{a: a, ctx: ctx, now: a.cfg.Now()}
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

// readEnds reads the specs and statuses of every session that holds a
// device, in transactions of at most 100 reads.
func (e *estimator) readEnds() error {
	if e.read {
		return e.err
	}
	e.read = true
	e.ends = map[string]*time.Time{}
	var ids []string
	seen := map[string]bool{}
	for _, n := range e.nodes {
		for _, d := range n.devices {
			if d.Session != "" && !seen[d.Session] {
				seen[d.Session] = true
				ids = append(ids, d.Session)
			}
		}
	}
	sort.Strings(ids)
	statuses := e.a.status.Snapshot()
	for start := 0; start < len(ids); start += 50 {
		batch := ids[start:min(start+50, len(ids))]
		ops := make([]clientv3.Op, 0, len(batch))
		for _, id := range batch {
			ops = append(ops, clientv3.OpGet(e.a.keys.Session(id)))
		}
		resp, err := e.a.cli.Txn(e.ctx).Then(ops...).Commit()
		if err != nil {
			e.err = fmt.Errorf("read session specs: %w", err)
			return e.err
		}
		for i, r := range resp.Responses {
			kvs := r.GetResponseRange().Kvs
			if len(kvs) == 0 {
				continue
			}
			spec, err := state.Decode[state.Session](kvs[0].Value)
			if err != nil {
				continue
			}
			limit := e.a.effectiveMaxRuntime(spec)
			if limit <= 0 {
				e.ends[batch[i]] = nil
				continue
			}
			// Not started yet (bound, starting): it cannot end later than
			// its limit from now.
			from := e.now
			if st, ok := statuses.Get(e.a.keys.Status(batch[i])); ok && st.Started != nil {
				from = *st.Started
			}
			end := from.Add(limit)
			e.ends[batch[i]] = &end
		}
	}
	return nil
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
	if err := e.readEnds(); err != nil {
		return &QueueEstimate{Message: "cannot be estimated now: " + err.Error()}
	}
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
