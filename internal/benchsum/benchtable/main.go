package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/voyager-gpu/voyager/internal/benchsum"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: benchtable FILE (the file $BENCH_SUMMARY named while the benchmarks ran)")
		os.Exit(2)
	}
	summary, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintf(os.Stderr, "read bench summary: %v\n", err)
		os.Exit(1)
	}
	load := "unknown"
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	host, _ := os.Hostname()
	table, err := benchsum.Table(fmt.Sprintf("bench summary (%s, load average %s at the end)", host, load), summary)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Print(table)
}
