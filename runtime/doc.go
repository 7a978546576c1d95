// Package runtime runs one session's containers on one machine: the node
// agent's only way to touch containers.
//
// Runtime is the small interface the agent consumes; Containerd implements
// it over containerd's Go client (namespace "voyager" by default) and Fake
// in memory. One contract suite, runtimetest.Run, holds both to the same
// behaviour. The package imports none of Voyager's other packages: it knows
// containers, images, cgroups and devices, not sessions or etcd.
package runtime
