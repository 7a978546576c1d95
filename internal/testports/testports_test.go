package testports_test

import (
	"net"
	"testing"

	"github.com/voyager-gpu/voyager/internal/testports"
)

// TestPickNeverTwice: ports of a range around one held open are handed
// out once each, and never the one held.
func TestPickNeverTwice(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	held := l.Addr().(*net.TCPAddr).Port
	seen := map[int]bool{}
	for range 20 {
		p := testports.Pick(t, "127.0.0.1", held-50, held+50, 1000)
		if p == held {
			t.Fatalf("port %d is held open, but was handed out", p)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
	}
	if testports.Bindable("127.0.0.1", held) {
		t.Errorf("a port held open is bindable")
	}
}
