// Package httpserver is Voyager's HTTP listener: the operational routes
// every voyager process serves (/healthz, /readyz, /metrics) and a server
// lifecycle (bind, serve, graceful shutdown) that other routes, such as the
// API's, are mounted into.
//
// Callers build an *http.ServeMux, call Routes to add the operational
// routes, add their own, and hand the mux to Listen.
package httpserver
