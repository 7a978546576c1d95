// Package api is Voyager's HTTP API: a gin router that authenticates JWTs,
// validates and authorises requests, writes session specs and queue entries
// to etcd through the state package, and reads status back — from etcd for
// one session, from watcher caches for the cluster-wide views (nodes, the
// queue, metrics).
//
// New builds it; Handler serves /api/v1/… and /openapi.json and is meant to
// be mounted on a process's http.ServeMux next to /healthz, /readyz and
// /metrics; Run keeps its caches current until its context ends. The
// routes, their errors (application/problem+json) and the log contract with
// the node agent are described in docs/api.md and served as an OpenAPI 3
// document.
package api
