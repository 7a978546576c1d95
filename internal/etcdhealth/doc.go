// Package etcdhealth tells whether the etcd every Voyager process depends on
// can serve it: /readyz's check (a linearizable read, and no alarm raised)
// and Prometheus gauges of etcd's alarms (NOSPACE: the database reached its
// quota and etcd refuses writes; CORRUPT: a member's data differs) and of
// its database size.
package etcdhealth
