package etcdtest

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// StartOwnCore starts Debian's etcd with fsync on CPU 0 only and moves
// this process onto the other CPUs (GOMAXPROCS their number) until tb
// ends: etcd on a core of its own, as a deployment gives it machines of
// its own, so that a benchmark's ratio to etcd's work is not one process
// taking CPU from the other. It fails tb on a machine of one CPU.
func StartOwnCore(tb testing.TB) *External {
	tb.Helper()
	needTwoCPUs(tb)
	e := StartExternalWith(tb, ExternalOptions{Fsync: true, CPUs: "0"})
	pinOffCPU0(tb)
	return e
}

// StartSecureOwnCore is StartOwnCore serving TLS with client certificates,
// as deployed (StartSecure).
func StartSecureOwnCore(tb testing.TB) *Secure {
	tb.Helper()
	needTwoCPUs(tb)
	s := StartSecureWith(tb, ExternalOptions{Fsync: true, CPUs: "0"})
	pinOffCPU0(tb)
	return s
}

func needTwoCPUs(tb testing.TB) {
	tb.Helper()
	if runtime.NumCPU() < 2 {
		tb.Fatalf("etcd on a core of its own needs 2 CPUs, this machine has %d", runtime.NumCPU())
	}
}

// pinOffCPU0 moves this process onto every CPU but 0 until tb ends.
func pinOffCPU0(tb testing.TB) {
	tb.Helper()
	var rest unix.CPUSet
	for i := 1; i < runtime.NumCPU(); i++ {
		rest.Set(i)
	}
	tb.Cleanup(PinProcess(tb, rest))
}

// PinProcess moves every thread of this process onto cpus (threads
// started later inherit it) and sets GOMAXPROCS to their number. It
// returns what undoes both.
func PinProcess(tb testing.TB, cpus unix.CPUSet) func() {
	tb.Helper()
	var was unix.CPUSet
	if err := unix.SchedGetaffinity(0, &was); err != nil {
		tb.Fatalf("read CPU affinity: %v", err)
	}
	set := func(to unix.CPUSet) {
		tids, err := os.ReadDir("/proc/self/task")
		if err != nil {
			tb.Fatalf("list threads: %v", err)
		}
		for _, t := range tids {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &to); err != nil && !errors.Is(err, unix.ESRCH) {
				tb.Fatalf("set CPU affinity of thread %d: %v", tid, err)
			}
		}
	}
	set(cpus)
	procs := runtime.GOMAXPROCS(cpus.Count())
	return func() {
		set(was)
		runtime.GOMAXPROCS(procs)
	}
}
