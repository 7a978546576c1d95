package nodeagent

import (
	"context"
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
	// The create's context ends only by its deadline, an hour away.
	if d, ok := c.Deadline(); !ok || time.Until(d) < 59*time.Minute {
		t.Errorf("the create's deadline %v, want the fence deadline an hour away", d)
	}
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
	if c.Err() == nil {
		t.Error("a create past the fence deadline may run")
	}
}
