package history_test

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
)

// soakCPU is the CPU time the soak has used: its own process's (placers,
// agents, controllers, users, checker), and its etcd members' (the live
// ones' from /proc, the killed ones' from the children this process
// waited for).
type soakCPU struct {
	self, agents, etcd time.Duration
	members            []time.Duration // the live members' own, by member
}

func (c soakCPU) total() time.Duration { return c.self + c.agents + c.etcd }

func (c soakCPU) sub(o soakCPU) soakCPU {
	return soakCPU{self: c.self - o.self, agents: c.agents - o.agents, etcd: c.etcd - o.etcd}
}

// perBind formats c a bind, as "total (test process + etcd) ms".
func (c soakCPU) perBind(binds int64) string {
	if binds <= 0 {
		return "-"
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(binds) }
	return fmt.Sprintf("%.1f ms (%.1f test process + %.1f agent processes + %.1f etcd)", ms(c.total()), ms(c.self), ms(c.agents), ms(c.etcd))
}

// readSoakCPU reads the CPU used so far. The children this process
// waited for are etcd members killed and agent processes ended; ap counts
// the latter.
func readSoakCPU(m *etcdtest.Members, ap *agentProcs) (soakCPU, error) {
	var self, children syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &self); err != nil {
		return soakCPU{}, fmt.Errorf("read own CPU: %w", err)
	}
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children); err != nil {
		return soakCPU{}, fmt.Errorf("read children's CPU: %w", err)
	}
	live, err := m.CPU()
	if err != nil {
		return soakCPU{}, err
	}
	tv := func(t syscall.Timeval) time.Duration { return time.Duration(t.Nano()) }
	ended := time.Duration(ap.ended.Load())
	c := soakCPU{self: tv(self.Utime) + tv(self.Stime), agents: ap.cpu(), etcd: tv(children.Utime) + tv(children.Stime) - ended, members: live}
	for _, d := range live {
		c.etcd += d
	}
	return c, nil
}

// loadAverage is /proc/loadavg's first three fields.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
