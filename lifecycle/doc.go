// Package lifecycle applies the rules that act on sessions over time, as
// opposed to on requests.
//
// Controller: idle notebooks (no Jupyter activity, no busy kernel, no GPU
// above the agent's busy percent, as the agent samples into the status),
// sessions reaching their max runtime, and notebooks on drained nodes each
// get a warning (warnings/<id>) and, when its stop time passes without the
// cause going away, an eviction in their spec that their agent carries
// out. Waiting higher-priority sessions preempt the fewest lower-priority
// preemptible sessions (placer.PlanPreemption); the victims are warned,
// stopped after a grace and re-queued, and the placers hold the freed node
// for the preemptor until it binds (the warnings, then the preemptor's
// queue entry, written with them: placer/preempthold.go). A waiting
// session of a team below its guarantee or its fair share reclaims,
// whatever the priorities, preemptible sessions of teams over theirs
// (placer/reclaim.go), their warnings and evictions saying so.
// Failed OnFailure sessions and preempted ones are put
// back in the queue at their retry time.
//
// Retention: finished sessions (and finished job arrays, with their
// elements) leave etcd after a configurable time, their
// final records appended to a history file first, so the keyspace stays
// bounded and nothing is lost.
//
// Like every Voyager component they keep no state of their own: any
// number may run; an etcd election for each lets one of them act at a
// time, and every write is a transaction conditional on what was read.
// See README.md for the rules and their numbers.
package lifecycle
