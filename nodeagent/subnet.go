package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/ctxwait"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// subnetCandidates bounds the derived subnets ClaimSubnet tries: 1,024 of
// the 16,384 /24s of 10.128.0.0/10, enough while fewer than about 15,000
// are taken.
const subnetCandidates = 1024

// afterSubnetRead, set only by tests, runs between a claim's read and its
// transaction: where another agent's claim can land.
var afterSubnetRead func()

// SubnetRequest is what ClaimSubnet decides a node's subnet from.
type SubnetRequest struct {
	// Node is the node whose subnet it is.
	Node string
	// Seed derives the default subnets (runtime.DefaultSubnet): the
	// agent's instance name.
	Seed string
	// Explicit is VOYAGER_AGENT_NETWORK_SUBNET; empty for the default.
	Explicit string
	// Current is the subnet the node's bridge carries now
	// (runtime.ReadBridge), "" when it has none; Busy says containers are
	// attached to it, which keep their addresses in it.
	Current string
	Busy    bool
}

// ErrSubnetKept means the node keeps the subnet its bridge carries,
// unclaimed, though another node's overlaps it: containers are attached
// to the bridge, and moving them to another subnet would cut them off.
// It moves at a start with none attached.
var ErrSubnetKept = errors.New("subnet kept unclaimed")

// ClaimSubnet returns the container subnet of req.Node's agent and
// records it as the node's claim (state.SubnetClaim, subnets/<node>), in
// a transaction that compares every claim unchanged since it read them,
// so that no two nodes of the cluster hold overlapping subnets and their
// multi-node jobs' meshes never overlap.
//
// req.Explicit is claimed as it is; it is an error, naming the node, if it
// overlaps a subnet another node claims or registered. Empty (or equal to
// the node's claim), the node keeps the subnet it claimed before, read
// alone; else the one its bridge carries, where no other node's claim or
// registered subnet overlaps it; else, with containers on its bridge, it
// keeps that one unclaimed (the subnet and an error wrapping
// ErrSubnetKept); else it takes the first of runtime.DefaultSubnet(seed),
// DefaultSubnet(seed+"/1"), … that overlaps no other node's. An agent
// whose transaction lost a race with another's claim reads again, backing
// off, until ctx ends.
func ClaimSubnet(ctx context.Context, cli *clientv3.Client, keys state.Keys, req SubnetRequest, now time.Time) (string, error) {
	node := req.Node
	// A restart: the node's own claim, taken where none overlapped, is
	// its subnet, read alone (a fleet that restarts at once reads no
	// other node's record).
	if c, _, err := state.Get[state.SubnetClaim](ctx, cli, keys.Subnet(node)); err == nil && (req.Explicit == "" || req.Explicit == c.Subnet) {
		return c.Subnet, nil
	} else if err != nil && !errors.Is(err, state.ErrNotFound) {
		return "", fmt.Errorf("read subnet claim of node %s: %w", node, err)
	}
	backoff := 50 * time.Millisecond
	for {
		got, done, err := claimSubnetOnce(ctx, cli, keys, req, now)
		if err != nil || done {
			return got, err
		}
		// Agents that start together take turns, each waiting longer
		// the more races it lost.
		if !ctxwait.Sleep(ctx, time.Duration(rand.Int64N(int64(backoff)))) {
			return "", fmt.Errorf("claim subnet for node %s: %w", node, ctx.Err())
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// claimSubnetOnce reads every claim and node record at one revision and
// tries one transaction; done is false when the transaction lost a race.
func claimSubnetOnce(ctx context.Context, cli *clientv3.Client, keys state.Keys, req SubnetRequest, now time.Time) (string, bool, error) {
	node, seed, explicit := req.Node, req.Seed, req.Explicit
	resp, err := cli.Txn(ctx).Then(clientv3.OpGet(keys.SubnetsDir(), clientv3.WithPrefix()),
		clientv3.OpGet(keys.Nodes(), clientv3.WithPrefix())).Commit()
	if err != nil {
		return "", false, fmt.Errorf("read subnet claims: %w", err)
	}
	if afterSubnetRead != nil {
		afterSubnetRead()
	}
	type held struct {
		net  *net.IPNet
		node string
		what string // the key it was read from, for errors
	}
	var taken []held
	mine := ""
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		c, err := state.Decode[state.SubnetClaim](kv.Value)
		if err != nil {
			return "", false, fmt.Errorf("read subnet claim %s: %w", kv.Key, err)
		}
		if string(kv.Key) == keys.Subnet(node) {
			mine = c.Subnet
			continue
		}
		if _, n, err := net.ParseCIDR(c.Subnet); err == nil {
			taken = append(taken, held{n, c.Node, string(kv.Key)})
		}
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		n, err := state.Decode[state.Node](kv.Value)
		if err != nil || n.Name == node || n.Subnet == "" {
			continue // a record the placers refuse too; this node's own
		}
		if _, sn, err := net.ParseCIDR(n.Subnet); err == nil {
			taken = append(taken, held{sn, n.Name, string(kv.Key)})
		}
	}
	overlap := func(cidr string) (held, bool) {
		_, c, err := net.ParseCIDR(cidr)
		if err != nil {
			return held{}, false
		}
		for _, h := range taken {
			if h.net.Contains(c.IP) || c.Contains(h.net.IP) {
				return h, true
			}
		}
		return held{}, false
	}
	free := func(cidr string) bool { _, ok := overlap(cidr); return !ok }
	want := explicit
	switch {
	case explicit != "":
		if h, ok := overlap(explicit); ok {
			return "", false, fmt.Errorf("claim subnet %s for node %s: it overlaps %s of node %s (%s); give each agent its own VOYAGER_AGENT_NETWORK_SUBNET, or delete a decommissioned node's claim with etcdctl del",
				explicit, node, h.net, h.node, h.what)
		}
	case mine != "" && free(mine):
		want = mine
	case req.Current != "" && free(req.Current):
		want = req.Current
	case req.Current != "" && req.Busy:
		h, _ := overlap(req.Current)
		return req.Current, true, fmt.Errorf("claim subnet for node %s: its bridge's %s overlaps %s of node %s (%s), and containers are attached to it: %w; it moves at a start with none",
			node, req.Current, h.net, h.node, h.what, ErrSubnetKept)
	default:
		for i := 0; want == "" && i < subnetCandidates; i++ {
			name := seed
			if i > 0 {
				name = fmt.Sprintf("%s/%d", seed, i)
			}
			if c := runtime.DefaultSubnet(name); free(c) {
				want = c
			}
		}
		if want == "" {
			return "", false, fmt.Errorf("claim subnet for node %s: the %d subnets derived from %q are all taken; set VOYAGER_AGENT_NETWORK_SUBNET", node, subnetCandidates, seed)
		}
	}
	if want == mine {
		return want, true, nil // its standing claim
	}
	v, err := state.Encode(state.SubnetClaim{Node: node, Subnet: want, Claimed: now.UTC()})
	if err != nil {
		return "", false, fmt.Errorf("claim subnet %s: %w", want, err)
	}
	// No claim written since the read: none created, none changed.
	unchanged := clientv3.Compare(clientv3.ModRevision(keys.SubnetsDir()), "<", resp.Header.Revision+1).WithPrefix()
	tr, err := cli.Txn(ctx).If(unchanged).Then(clientv3.OpPut(keys.Subnet(node), v)).Commit()
	if err != nil {
		return "", false, fmt.Errorf("claim subnet %s: %w", want, err)
	}
	return want, tr.Succeeded, nil
}
