package etcdtest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
)

// FreeAddr's ports lie below Linux's default ephemeral range
// (32768-60999) and above the well-known ones: a port taken from the
// ephemeral range (a listen on port 0, then closed) can be handed to
// another process's outgoing connection before the server that was meant
// to bind it does. runtimetest's ports for containers lie above that
// range, so the two never meet.
const freeAddrFirst, freeAddrLast = 20000, 31999

// handedOut holds the ports FreeAddr has returned in this process: none
// is held open, so without it two calls could return the same port.
var handedOut struct {
	sync.Mutex
	ports map[int]bool
}

// FreeAddr returns a loopback address (127.0.0.1:port) whose port was
// free a moment ago and lies outside the kernel's ephemeral range, for a
// server the test starts; never one it has returned before in this
// process.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.ports == nil {
		handedOut.ports = map[int]bool{}
	}
	for range 1000 {
		p := freeAddrFirst + rand.IntN(freeAddrLast-freeAddrFirst+1)
		if handedOut.ports[p] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		_ = l.Close()
		handedOut.ports[p] = true
		return fmt.Sprintf("127.0.0.1:%d", p)
	}
	tb.Fatalf("find free port: none of 1000 tried in %d-%d was free", freeAddrFirst, freeAddrLast)
	return ""
}
