// Package state is the one place that knows Voyager's etcd key schema: the
// key names under a configurable prefix, the JSON value types stored there,
// and the transactions that move a session between them.
//
// It is a leaf: it imports nothing of Voyager's, so the API, the placer, the
// node agent and the CLI all agree on the schema by importing it. Values are
// plain JSON that an operator can read with `etcdctl get --prefix /voyager/`;
// docs/state.md lists every key, its shape, its writer and its readers.
package state
