// Package placer binds pending sessions to exact GPUs.
//
// A placer holds nothing but a cache of etcd: the queue (pending/), live
// nodes (nodes/), their ledgers, cordons, quotas and the other live placers.
// Each pass takes a snapshot, plans the whole queue deterministically
// (Plan: order, filter, score, choose devices), and commits the part of the
// plan on the nodes it owns in conditional etcd transactions. Kill it at any
// moment and nothing is lost: the next placer plans again from etcd.
//
// README.md in this directory draws the pipeline and keeps the glossary.
package placer
