// Command clean-host removes every Voyager object left on this machine:
// containers in voyager* containerd namespaces and in those agents
// recorded, isolated networks (bridges, iptables chains, CNI records),
// the tests' network namespaces and bridges, simulated CDI specs and
// unused private test containerds (internal/hostclean, Sweep with All).
// It removes them whether or not they are in use: stop voyager dev and
// tests first. For a developer's or CI machine, never a production node.
// make clean-host runs it (as root).
package main
