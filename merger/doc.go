// Package merger writes sessions' statuses from the parts their agents
// report. An agent's etcd role may write only its own node's keys, and a
// session's status (status/<id>) belongs to no node, so each agent reports
// what it sees of its part of a session at parts/<node>/<id>
// (state.PartStatus); a Merger watches parts/ and folds the parts of each
// session into its status with state.MergeParts, through the session
// state machine.
//
// Every placer process (and `voyager dev`) runs one. Any number may run at
// once: each merge reads the status, the spec and the session's parts in
// one round trip and writes in a transaction that compares the mod
// revision of every one of them, so two mergers never write a status from
// different reads, and a part that changed meanwhile is merged again.
// The mergers of placer processes (Config.Member, their placer's id) share
// the sessions by rendezvous hashing over the live placers (placers/): a
// part's change is merged at once by one of them, not read and merged by
// each (share.go); the others merge it at their resync, and merge a dead
// placer's share as soon as its key goes.
// A session is merged Config.Settle (100 ms) after its first part change,
// so that a part's quick succession of changes is merged once; its read
// is served by any member that has applied those changes (serializable),
// and a refused transaction reads from the leader.
// A Merger also deletes the parts it has done with: a part whose end is
// in the status, and a stale part (of another queueing, or of a session
// whose status is gone), and, in the transaction that writes a session's
// end (or its wait to run again), the session's lifecycle warning
// (warnings/<id>): the attempt it warned of is over.
package merger
