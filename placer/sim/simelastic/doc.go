// Command simelastic prints placer/sim's table of elastic jobs against
// fixed-size ones (`make sim-elastic`, placer/README.md "Elastic jobs
// against fixed sizes"): every shape of sim.ElasticSuite for seeds 1..N,
// the elastic jobs fixed at their minimum, at their maximum, elastic
// (size-blind) and elastic with goodput reports.
package main
