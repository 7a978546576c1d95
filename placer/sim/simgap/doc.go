// Command simgap measures the planner's gap to the optimum (issue 40) on
// every workload shape of placer/sim's suite: each run is simulated with
// the placer's default settings, its arrivals made an optimisation
// instance, and solved exactly when small, else by ε-NSGA-II
// (placer/sim/search.go); it prints one Markdown table with the gap on
// mean wait, active machines and stranded GPUs. `make sim-gap` runs it.
package main
