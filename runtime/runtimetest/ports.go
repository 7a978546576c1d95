package runtimetest

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/voyager-gpu/voyager/internal/testports"
)

// Ports that tests publish for sessions lie above Linux's default ephemeral
// range (32768-60999). An isolated session's published port is a DNAT rule
// for every local address of the host, the loopback included: had a test
// published a port the kernel could also hand out for a listen on port 0,
// another test's server given that port (an httptest server, an embedded
// etcd) would have its connections sent into the container instead, and be
// refused. Above 60999 the kernel hands out nothing, so only tests that ask
// for these ports get them. FreePort and FreePortRange draw from disjoint
// parts of that space, so concurrent test packages do not collide.
const (
	freePortFirst, freePortLast   = 62000, 63999
	freeRangeFirst, freeRangeLast = 64000, 65499
)

// FreePort returns a TCP port above the ephemeral range that was free on
// every address a moment ago, for a session to publish; never one it has
// returned before in this process.
func FreePort(t testing.TB) int {
	t.Helper()
	return testports.Pick(t, "0.0.0.0", freePortFirst, freePortLast, 100)
}

// FreePortRange returns "first-last", n ports above the ephemeral range
// that were all free a moment ago, for an agent's VOYAGER_AGENT_PORTS.
func FreePortRange(t testing.TB, n int) string {
	t.Helper()
	slots := (freeRangeLast - freeRangeFirst + 1) / n
	if slots < 1 {
		t.Fatalf("a range of %d ports does not fit in %d-%d", n, freeRangeFirst, freeRangeLast)
	}
	for range 50 {
		base := freeRangeFirst + rand.IntN(slots)*n
		free := true
		for p := base; p < base+n && free; p++ {
			free = testports.Bindable("0.0.0.0", p)
		}
		if free {
			return fmt.Sprintf("%d-%d", base, base+n-1)
		}
	}
	t.Fatalf("no free range of %d ports in %d-%d", n, freeRangeFirst, freeRangeLast)
	return ""
}
