// Package etcdrbac is the table of Voyager's etcd users and roles, each
// with the least key ranges its component needs, and the two operations
// over a real cluster: Setup (idempotent: makes etcd's roles, users and
// grants equal to the table and turns authentication on) and Check (says
// where they differ).
//
// A component's etcd user is named like its role. With etcd's
// --client-cert-auth the CN of the component's client certificate is its
// user (internal/pki issues them so); users may also have passwords.
// docs/deployment.md explains each role's ranges and the one right that a
// key prefix cannot narrow (agents write every status/).
package etcdrbac
