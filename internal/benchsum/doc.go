// Package benchsum collects the figures benchmarks report into one summary
// table: each benchmark appends a row (figure, value, the ceiling measured
// in the same run, and their ratio) to the file named by $BENCH_SUMMARY,
// and `make bench` prints that file once every package has run.
package benchsum
