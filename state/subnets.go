package state

import "time"

// dirSubnets holds one record per node: the container subnet its agent
// claimed.
const dirSubnets = "subnets"

// SubnetClaim is subnets/<node>: the container subnet node's agent took
// for its sessions' own addresses (Node.Subnet). An agent writes its claim
// in a transaction that compares every key under subnets/ unchanged since
// it read them and found no other node's claim overlapping, so no two
// nodes of a cluster ever hold overlapping subnets. It keeps the claim
// across restarts. The claim outlives the agent's lease (the node's
// sessions may still hold addresses in it): remove a decommissioned
// node's claim with etcdctl del.
type SubnetClaim struct {
	Node    string    `json:"node"`
	Subnet  string    `json:"subnet"`
	Claimed time.Time `json:"claimed"`
}

// SubnetsDir is the prefix of every SubnetClaim.
func (k Keys) SubnetsDir() string { return k.dir(dirSubnets) }

// Subnet is the key of node's SubnetClaim.
func (k Keys) Subnet(node string) string { return k.key(dirSubnets, node) }
