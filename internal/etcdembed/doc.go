// Package etcdembed runs an etcd server inside the current process: the
// default store of `voyager dev` and the real etcd that tests run against.
//
// It is a thin lifecycle wrapper over go.etcd.io/etcd/server/v3/embed that
// chooses loopback ports, keeps etcd's own logs quiet, and hands back a
// ready client. Nothing in it knows Voyager's key schema.
package etcdembed
