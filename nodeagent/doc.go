// Package nodeagent is the agent of one GPU machine: it registers the
// machine's inventory under a lease, watches the machine's bindings and
// drives a runtime.Runtime to run exactly what is bound, reporting what
// it sees of each session's part at parts/<node>/<id> (state.PartStatus),
// which the placers' status merger folds into the session's status.
//
// The lease is the context of the agent's work and its right to run
// containers. The agent renews it itself and, when no renewal has succeeded
// within Config.FenceAfter of the last good one's send (or etcd says it is
// gone), fences: every worker derived from it stops and every running
// container of the node is stopped and removed, before etcd can expire the
// lease and the placers re-queue its sessions elsewhere. It then registers
// again and reconciles, removing orphans before it starts anything new. A
// shutdown leaves the containers running; the next agent adopts them by
// label.
package nodeagent
