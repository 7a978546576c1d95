package etcdtest

import (
	"fmt"
	"testing"

	"github.com/voyager-gpu/voyager/internal/testports"
)

// FreeAddr's ports lie below Linux's default ephemeral range
// (32768-60999) and above the well-known ones: a port taken from the
// ephemeral range (a listen on port 0, then closed) can be handed to
// another process's outgoing connection before the server that was meant
// to bind it does. runtimetest's ports for containers lie above that
// range, so the two never meet.
const freeAddrFirst, freeAddrLast = 20000, 31999

// FreeAddr returns a loopback address (127.0.0.1:port) whose port was
// free a moment ago and lies outside the kernel's ephemeral range, for a
// server the test starts; never one it has returned before in this
// process.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	return fmt.Sprintf("127.0.0.1:%d", testports.Pick(tb, "127.0.0.1", freeAddrFirst, freeAddrLast, 1000))
}
