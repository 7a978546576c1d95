// Command simgap measures the planner's gap to the optimum (issue 40) on
// every workload shape of placer/sim's suite: each run is simulated with
// the placer's default settings, its arrivals made an optimisation
// instance, and solved exactly when small, else by ε-NSGA-II
// (placer/sim/search.go, up to -search-limit sessions) and the
// rolling-horizon search (placer/sim/window.go), and bounded from below
// (placer/sim/bound.go); it prints one Markdown table with the planner's
// gap to the best schedule found and to the bound on mean wait and active
// machines, and its gap on stranded GPUs, and with -orders each seed
// order's mean wait alone. `make sim-gap` runs it at 16 nodes, `make
// sim-gap-scale` at 200 and 2,000.
package main
