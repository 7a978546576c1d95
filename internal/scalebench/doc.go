// Package scalebench is what the large-site benchmarks share (the placer's
// and the API's, `make bench-scale`): a load generator that registers
// simulated nodes under leases it keeps alive, a voyager subcommand run as
// its own process with its resident memory and CPU time read from /proc,
// and a reader of that process's Prometheus metrics.
package scalebench
