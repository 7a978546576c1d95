// Package etcdtest gives tests a real etcd: an embedded server in the test
// process with its own temporary data directory and loopback ports, torn
// down when the test ends.
package etcdtest
