package runtime

import (
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// rlimitResources maps the limits a Spec may set to their setrlimit(2)
// resource numbers.
var rlimitResources = map[string]int{
	"RLIMIT_AS": unix.RLIMIT_AS, "RLIMIT_CORE": unix.RLIMIT_CORE, "RLIMIT_CPU": unix.RLIMIT_CPU,
	"RLIMIT_DATA": unix.RLIMIT_DATA, "RLIMIT_FSIZE": unix.RLIMIT_FSIZE, "RLIMIT_LOCKS": unix.RLIMIT_LOCKS,
	"RLIMIT_MEMLOCK": unix.RLIMIT_MEMLOCK, "RLIMIT_MSGQUEUE": unix.RLIMIT_MSGQUEUE, "RLIMIT_NICE": unix.RLIMIT_NICE,
	"RLIMIT_NOFILE": unix.RLIMIT_NOFILE, "RLIMIT_NPROC": unix.RLIMIT_NPROC, "RLIMIT_RSS": unix.RLIMIT_RSS,
	"RLIMIT_RTPRIO": unix.RLIMIT_RTPRIO, "RLIMIT_RTTIME": unix.RLIMIT_RTTIME,
	"RLIMIT_SIGPENDING": unix.RLIMIT_SIGPENDING, "RLIMIT_STACK": unix.RLIMIT_STACK,
}

// capSysResource is CAP_SYS_RESOURCE's bit in /proc/self/status's CapEff.
const capSysResource = 24

// canRaiseRlimits reports whether this process may raise hard resource
// limits (CAP_SYS_RESOURCE). containerd's shim and runc, which set a
// container's limits, run with the privileges of the host's root as this
// process (the agent) does, so what it may, they may.
func canRaiseRlimits() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return true
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err != nil || caps&(1<<capSysResource) != 0
		}
	}
	return true
}

// Grantable returns rs lowered to what this host can grant: a process
// without CAP_SYS_RESOURCE (root in an unprivileged sandbox) cannot raise
// a hard limit above its own, so runc would fail the start with "operation
// not permitted"; such a limit is capped at this process's hard limit
// instead. It also reports whether it lowered any. With the capability, rs
// is returned as it is.
func Grantable(rs []Rlimit) ([]Rlimit, bool) {
	if len(rs) == 0 || canRaiseRlimits() {
		return rs, false
	}
	out := make([]Rlimit, len(rs))
	lowered := false
	for i, r := range rs {
		out[i] = r
		res, ok := rlimitResources[r.Type]
		var own unix.Rlimit
		if !ok || unix.Getrlimit(res, &own) != nil {
			continue
		}
		if own.Max != unix.RLIM_INFINITY && (r.Hard == RlimitInfinity || r.Hard > own.Max) {
			out[i].Hard, lowered = own.Max, true
			out[i].Soft = min(out[i].Soft, own.Max)
		}
	}
	return out, lowered
}
