// Package hostclean finds and removes what Voyager's agents and tests leave
// on a machine outside etcd: containers still running in containerd
// namespaces named voyager*, isolated networks (bridges, iptables chains,
// CNI address records), named network namespaces, simulated CDI specs and
// the directories of private test containerds.
//
// Two modes. Sweep with All (make clean-host) removes every such object on
// the machine, in use or not: for a developer's machine after killed runs,
// never for a production node. Without All it removes only what it can
// prove is a leftover of a test: objects recorded (runtime.RecordOwner)
// under a test binary that has ended (runtime.EnvHostOwner, which the
// binary's agents and voyager dev processes inherit), and containerd
// namespaces voyager-test-<pid>-<n> whose pid has ended. The test harnesses
// run that at the start of every test binary, so a run killed midway is
// cleaned by the next one. Every sweep but one limited by Options.Match
// also removes the containerd shims' sockets that nothing listens on any
// more (ShimSocketRoot): a shim killed before it removed its own leaves
// one, whoever ran it, and no process can use it.
package hostclean
