// Package runtime runs one session's containers on one machine: the node
// agent's only way to touch containers.
//
// Runtime is the small interface the agent consumes; Containerd implements
// it over containerd's Go client (namespace "voyager" by default) and Fake
// in memory. One contract suite, runtimetest.Run, holds both to the same
// behaviour. The package imports none of Voyager's other packages: it knows
// containers, images, cgroups and devices, not sessions or etcd. Both
// also list a container's processes (ProcessLister), by which the agent
// tells a session's own processes on a shared GPU from its neighbours'.
//
// With NetworkOptions{Mode: NetworkIsolated} each container gets its own
// network namespace on the instance's CNI bridge (go-cni driving the
// bridge, host-local, portmap, firewall and loopback plugins) and the
// instance's firewall chains keep it off the machine's listeners and other
// containers; only the ports its Spec publishes are reachable
// (docs/networking.md).
package runtime
