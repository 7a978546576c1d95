// Package audit is Voyager's append-only audit trail: one JSON object per
// line for every state-changing call (who, on behalf of whom, what, on
// which object, when, and how it ended), written to a local file that is
// rotated by size and never rewritten.
//
// A Log is opened on a path and written by any number of goroutines; it
// reads back its own file and the rotated ones, oldest first, under a
// Filter. The API records every write through its middleware, and a
// handler adds what only it knows (an exec's command, a port) to its
// request's record; any other component may call Log.Write itself.
// Collectors counts records by action and outcome for Prometheus.
package audit
