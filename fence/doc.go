// Package fence is the out-of-process fence of a node: a node's session
// containers stop before its lease can expire even when its agent cannot
// stop them (killed, paused, stuck in a hung containerd or etcd call).
//
// The agent writes a heartbeat file (Heartbeat, in the fence directory)
// after every successful renewal of its node lease: the deadline by which
// it must renew again or fence, on the machine's boot-time clock, and the
// containers of the node. A Keeper, a process of its own (`voyager
// fence-keeper`), reads it a few times a second; once the deadline has
// passed it kills every listed container's processes itself, through
// /proc and signals (SIGTERM, the grace, SIGKILL), without asking the
// agent, containerd or etcd, and leaves a Record per container saying when
// and why, so that the agent reports the attempt as fenced rather than as
// an exit. docs/architecture.md ("A fence that does not need the agent")
// says why this mechanism, what it costs and what a tenant can do to it.
//
// The package imports nothing of Voyager's: the agent and the keeper share
// only the files.
package fence
