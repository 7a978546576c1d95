package runtimetest

import (
	"net"
	"strings"
	"testing"
)

// MachineAddr returns an IPv4 address of this machine other than loopback
// (and other than a session bridge's, vy…): where etcd, an agent or a
// session's published port is reached on a real cluster, and what an
// isolated session must not reach. It skips the test on a machine with
// none.
func MachineAddr(t testing.TB) string {
	t.Helper()
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range ifs {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 || strings.HasPrefix(i.Name, "vy") {
			continue
		}
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
				return n.IP.String()
			}
		}
	}
	t.Skip("no non-loopback IPv4 address on this machine")
	return ""
}
