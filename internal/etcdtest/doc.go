// Package etcdtest gives tests a real etcd: an embedded server in the test
// process with its own temporary data directory and loopback ports, torn
// down when the test ends; Debian's etcd in its own process
// (StartExternal, or with TLS StartSecure), or on a core of its own with
// the test process moved off it (StartOwnCore and StartSecureOwnCore, for
// benchmarks); a cluster of Debian's etcd processes (or a binary that
// runs etcd's main) that a test can kill and restart member by member,
// on loopback ports or unix sockets (StartMembers, StartMembersWith); and
// a TCP proxy in front of either that a test can cut like
// a network partition (NewProxy), or the same cut inside a client's own
// dialer, with no proxy's copy in between (NewLink).
package etcdtest
