// Package lifecycle applies the rules that act on sessions over time, as
// opposed to on events: for now, retention — finished sessions leave etcd
// after a configurable time, their final records appended to a history
// file first, so the keyspace stays bounded and nothing is lost.
//
// Like every Voyager component it keeps no state of its own: any number may
// run; an etcd election lets one of them act at a time.
package lifecycle
