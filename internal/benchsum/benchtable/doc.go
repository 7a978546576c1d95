// Command benchtable prints the summary file that benchmarks filled
// through package benchsum as one table, headed by the machine's load
// average; `make bench` and `task bench` run it after the benchmarks.
//
// Usage: go run ./internal/benchsum/benchtable FILE
package main
