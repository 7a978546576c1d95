// Package history checks Voyager's safety invariants over etcd's history:
// every revision of the keyspace, in order, with previous values, not only
// the final state. A Checker holds a model of nodes, ledgers, bindings,
// queue entries and statuses, applies each revision's changes to it, and
// reports every revision after which a rule is broken:
//
//   - gpu-shared: a GPU (or MIG device) UUID is in two allocations, or a
//     GPU held whole beside a MIG device of it;
//   - node-over: a node's allocations exceed its CPU or memory, or hold a
//     port twice or outside its range;
//   - binding-without-allocation / allocation-without-binding: a binding
//     and its ledger allocation do not come and go together;
//   - phase-edge: a session's phase moved along no edge of the state
//     machine (state.Machine);
//   - finished-requeued: a finished session is queued or Pending again;
//   - binding-differs: a binding names other devices or ports than its
//     allocation;
//   - device-not-in-inventory: an allocated device that its node's
//     inventory lists neither as a device nor as its physical GPU;
//   - left-behind: a binding or allocation left for a session re-queued or
//     ended for its node's loss, or past a bound for one that ended;
//   - no-progress: Bound, Starting or Stopping (or waiting past retryAt,
//     or Running with no binding and no allocation left) longer than a
//     bound, by the history's own clock;
//   - container-without-binding: a binding deleted while its part says
//     its container runs;
//   - launched-twice: an attempt's launch (state.Launch's record on its
//     part) recorded a second time, or for a binding or queueing that was
//     not live;
//   - history-gap: a status's etcd version does not follow on from the
//     model's, or (given previous values) etcd's previous value of it
//     differs from the model's: a revision was missed.
//
// Watch follows a live cluster read-only from a start revision; it needs
// only the revisions from there on, so compaction behind its start does not
// matter. `voyager check` runs it from the command line.
package history
