// Command simpower measures the pack strategy (VOYAGER_PLACER_STRATEGY=pack,
// issue 40) against binpack and spread on placer/sim's power shapes: low
// and moderate load, a day of rising and falling load, and two of the
// suite's shapes at high load; it prints the mean active machines, the
// machines empty long enough to power down, and the waits. `make
// sim-power` runs it.
package main
