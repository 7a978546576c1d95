package testports

import (
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
)

// handedOut holds the ports Pick has returned in this process: none is
// held open, so without it two calls could return the same port.
var handedOut struct {
	sync.Mutex
	ports map[int]bool
}

// Pick returns a port from first to last (both included) that it has not
// returned before in this process and that could be listened on at host
// (such as 127.0.0.1, or 0.0.0.0 for every address) a moment ago. It
// tries up to tries random ports, then fails tb.
func Pick(tb testing.TB, host string, first, last, tries int) int {
	tb.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.ports == nil {
		handedOut.ports = map[int]bool{}
	}
	for range tries {
		p := first + rand.IntN(last-first+1)
		if !handedOut.ports[p] && Bindable(host, p) {
			handedOut.ports[p] = true
			return p
		}
	}
	tb.Fatalf("find free port: none of %d tried in %d-%d was free at %s", tries, first, last, host)
	return 0
}

// Bindable reports whether port p can be listened on at host now.
func Bindable(host string, p int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort(host, fmt.Sprint(p)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}
