// Package nodeagent is the agent of one GPU machine: it registers the
// machine's inventory under a lease, watches the machine's bindings and
// drives a runtime.Runtime to run exactly what is bound, reporting each
// session's status.
//
// The lease is the context of the agent's work: when it is lost, every
// worker derived from it stops (containers keep running) and the agent
// registers again, then reconciles, adopting its containers by label.
// Containers are stopped only on what a synced watch says (a session
// stopped, a binding gone), never because etcd is unreachable.
package nodeagent
