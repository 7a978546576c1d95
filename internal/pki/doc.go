// Package pki makes the certificates of a Voyager cluster with Go's
// crypto/x509: one CA, and leaf certificates for etcd members (serving
// clients and peers), for components (their etcd client identity, whose CN
// is their etcd user, and their HTTPS listener) and for node agents.
//
// Keys are ECDSA P-256. Every leaf may serve and authenticate (both
// extended key usages), so one file pair per process covers its etcd
// client certificate and its HTTPS listener. `voyager certs` drives it;
// docs/deployment.md says how to rotate without downtime.
package pki
