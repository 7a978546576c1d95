package nodeagent

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestCreateContextEndsOnAFenceNotOnAStop: the create after a recorded
// launch outlives a graceful stop (Run's context ended) but not a fence
// or a lost lease (the lease's context ended while Run's goes on), nor the
// fence deadline of the last renewal.
func TestCreateContextEndsOnAFenceNotOnAStop(t *testing.T) {
	a := New(Config{Node: "n1", Simulated: true, FenceAfter: time.Hour})
	a.renewed.Store(time.Now().UnixNano())
	run, stopRun := context.WithCancel(context.Background())
	a.runCtx.Store(&run)

	// A fence: the lease's context ends, Run's does not.
	lease, fence := context.WithCancelCause(run)
	c, cancel := a.createContext(lease)
	fence(errFenced)
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the create outlived the fence")
	}
	cancel()

	// A graceful stop: Run's context ends, and the lease's with it.
	lease, endLease := context.WithCancelCause(run)
	defer endLease(nil)
	c, cancel = a.createContext(lease)
	defer cancel()
	stopRun()
	<-lease.Done()
	after := make(chan struct{})
	context.AfterFunc(lease, func() { close(after) })
	<-after // the create context's own AfterFunc on lease has run as well, or runs now
	select {
	case <-c.Done():
		t.Fatalf("the create ended with the graceful stop: %v", context.Cause(c))
	case <-time.After(200 * time.Millisecond):
	}

	// The fence deadline of the last renewal.
	a.renewed.Store(time.Now().Add(-2 * time.Hour).UnixNano())
	c, cancel = a.createContext(context.Background())
	defer cancel()
	if !errors.Is(context.Cause(c), errFenceDeadline) {
		t.Errorf("a create past the fence deadline may run (cause %v)", context.Cause(c))
	}
}

// TestCreateContextDeadlineMovesWithRenewals: a create may take longer
// than FenceAfter (a multi-node part waits in it for its peers) while the
// agent renews; once renewals stop, it ends at the latest renewal's fence
// deadline.
func TestCreateContextDeadlineMovesWithRenewals(t *testing.T) {
	const fenceAfter = 300 * time.Millisecond
	a := New(Config{Node: "n1", Simulated: true, FenceAfter: fenceAfter})
	a.renewed.Store(time.Now().UnixNano())
	c, cancel := a.createContext(context.Background())
	defer cancel()

	renewing, stopRenewing := context.WithCancel(context.Background())
	go func() {
		tick := time.NewTicker(fenceAfter / 3)
		defer tick.Stop()
		for {
			select {
			case <-renewing.Done():
				return
			case <-tick.C:
				a.renewed.Store(time.Now().UnixNano())
			}
		}
	}()
	select {
	case <-c.Done():
		stopRenewing()
		t.Fatalf("the create ended while the agent renewed: %v", context.Cause(c))
	case <-time.After(5 * fenceAfter):
	}
	stopRenewing()
	stopped := time.Now()
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the create outlived its fence deadline by 10s after renewals stopped")
	}
	if !errors.Is(context.Cause(c), errFenceDeadline) {
		t.Errorf("the create ended with %v, want the fence deadline", context.Cause(c))
	}
	if last := time.Unix(0, a.renewed.Load()); time.Now().Before(last.Add(fenceAfter)) {
		t.Errorf("the create ended %s after renewals stopped, before the latest renewal's fence deadline %s", time.Since(stopped), last.Add(fenceAfter))
	}
}
