package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// subnetter is a Runtime whose containers have addresses of their own:
// Subnet is where they come from ("" on the host's network).
type subnetter interface{ Subnet() string }

// MeshWait bounds how long a multi-node job's part waits, its container
// made and its process not yet started, for the other parts' addresses.
// The placer bound the parts together, so they start together; a part
// whose peer never reports one (its node lost, its image missing) is
// ended sooner by the job's own end.
const MeshWait = 10 * time.Minute

// meshPart is what a part needs of a peer to wait for its address and
// route to it.
type meshPart struct {
	node, subnet, via string
	attempt           int
	queueRevision     int64
}

// mesh returns the Spec.Mesh of a multi-node job's part whose peers are
// parts (every part of the job, in rank order), or nil when its parts do
// not reach each other at their containers' addresses: the host's network
// (everything is reachable), or JobRoutes off, here or on any part's node
// (such a node records no subnet), so that every part decides alike from
// the node records and none waits for a peer that never reports. The hook reports the
// container's address in the part's status, then waits until every other
// part has reported its own, so that every rule names its peers before
// any process runs (NCCL's ranks connect to each other as soon as they
// have met at MASTER_ADDR).
func (w *worker) mesh(parts []JobPart, stop <-chan struct{}) func(context.Context, string) ([]runtime.MeshPeer, error) {
	cfg := w.a.cfg
	sn, ok := cfg.Runtime.(subnetter)
	if !ok || sn.Subnet() == "" || cfg.JobRoutes == JobRoutesOff {
		return nil
	}
	var peers []meshPart
	for _, p := range parts {
		if p.Subnet == "" {
			return nil
		}
	}
	for _, p := range parts {
		if p.Node == cfg.Node {
			continue
		}
		m := meshPart{node: p.Node, subnet: p.Subnet, attempt: p.attempt, queueRevision: p.queueRevision}
		if cfg.JobRoutes == JobRoutesDirect {
			m.via = p.Address
		}
		peers = append(peers, m)
	}
	return func(ctx context.Context, addr string) ([]runtime.MeshPeer, error) {
		w.setPart(ctx, state.EventCreate, func(st *state.PartStatus) {
			st.Address = addr
			st.Reason, st.Message = "Meshing", "waiting for the job's other parts' addresses"
		})
		// The peers wait for this address: a write that did not land
		// (fenced, a refused transition) fails the start now rather than
		// after MeshWait.
		if p, _, err := w.currentPart(ctx); err != nil || p.Address != addr {
			return nil, fmt.Errorf("report the address of job %s's part: the part says %q (%v)", w.item.Value.Session, p.Address, err)
		}
		return w.awaitPeers(ctx, peers, stop)
	}
}

// awaitPeers waits until every peer's part reports its container's
// address for the binding the job's parts were read with, and returns
// them. It fails when a peer ends first, when stop closes or after
// MeshWait.
func (w *worker) awaitPeers(ctx context.Context, peers []meshPart, stop <-chan struct{}) ([]runtime.MeshPeer, error) {
	cfg := w.a.cfg
	id := w.item.Value.Session
	ctx, cancel := context.WithTimeoutCause(ctx, MeshWait, fmt.Errorf("no address from every other part of job %s after %s", id, MeshWait))
	defer cancel()
	keys := make([]string, len(peers))
	for i, p := range peers {
		keys[i] = cfg.Keys.Part(p.node, id)
	}
	// One watch per key that has no address yet, from the revision read.
	changed, ended := make(chan struct{}, 1), make(chan string)
	watched := map[string]bool{}
	for {
		ops := make([]clientv3.Op, len(keys))
		for i, k := range keys {
			ops[i] = clientv3.OpGet(k)
		}
		resp, err := cfg.Client.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, fmt.Errorf("wait for the addresses of job %s's parts: %w", id, context.Cause(ctx))
		}
		out := make([]runtime.MeshPeer, 0, len(peers))
		var waiting []string
		for i, p := range peers {
			kvs := resp.Responses[i].GetResponseRange().Kvs
			var st state.PartStatus
			if len(kvs) > 0 {
				if st, err = state.Decode[state.PartStatus](kvs[0].Value); err != nil {
					return nil, fmt.Errorf("wait for the addresses of job %s's parts: %w", id, err)
				}
			}
			mine := len(kvs) > 0 && st.QueueRevision == p.queueRevision && st.Attempt == p.attempt
			switch {
			case mine && st.Phase.Terminal():
				return nil, fmt.Errorf("wait for the addresses of job %s's parts: the part on %s ended before the job started (%s: %s)", id, p.node, st.Reason, st.Message)
			case mine && st.Address != "":
				out = append(out, runtime.MeshPeer{Addr: st.Address, Subnet: p.subnet, Via: p.via})
				continue
			}
			waiting = append(waiting, p.node)
			if !watched[keys[i]] {
				watched[keys[i]] = true
				key := keys[i]
				wch := cfg.Client.Watch(clientv3.WithRequireLeader(ctx), key, clientv3.WithRev(resp.Header.Revision+1))
				go func() {
					for range wch {
						select {
						case changed <- struct{}{}:
						default:
						}
					}
					select { // a watch that broke is made again
					case ended <- key:
					case <-ctx.Done():
					}
				}()
			}
		}
		if len(waiting) == 0 {
			w.log.Debug("every part of the job has its address", "peers", len(out))
			return out, nil
		}
		select {
		case <-changed:
		case k := <-ended:
			delete(watched, k)
		case <-stop:
			return nil, errors.New("stopped while waiting for the other parts' addresses")
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the addresses of job %s's parts (on %s): %w", id, strings.Join(slices.Compact(waiting), ", "), context.Cause(ctx))
		}
	}
}
