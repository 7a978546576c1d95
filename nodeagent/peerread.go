package nodeagent

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
)

// bindingsAndNodes reads, in one round trip, session id's binding on each
// of nodes and each node's record, in the order of nodes: nil where there
// is none. A gang's part reads where its other parts run this way rather
// than one key at a time.
func (a *Agent) bindingsAndNodes(ctx context.Context, id string, nodes []string) ([]*state.Binding, []*state.Node, error) {
	k := a.cfg.Keys
	ops := make([]clientv3.Op, 0, 2*len(nodes))
	for _, n := range nodes {
		ops = append(ops, clientv3.OpGet(k.Binding(n, id)), clientv3.OpGet(k.Node(n)))
	}
	resp, err := a.cfg.Client.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, nil, fmt.Errorf("read the parts of %s: %w", id, err)
	}
	kvs := state.FirstKVs(resp)
	bs, ns := make([]*state.Binding, len(nodes)), make([]*state.Node, len(nodes))
	for i, n := range nodes {
		if kv := kvs[2*i]; kv != nil {
			b, err := state.Decode[state.Binding](kv.Value)
			if err != nil {
				return nil, nil, fmt.Errorf("read the binding of %s on %s: %w", id, n, err)
			}
			bs[i] = &b
		}
		if kv := kvs[2*i+1]; kv != nil {
			rec, err := state.Decode[state.Node](kv.Value)
			if err != nil {
				return nil, nil, fmt.Errorf("read node %s: %w", n, err)
			}
			ns[i] = &rec
		}
	}
	return bs, ns, nil
}
