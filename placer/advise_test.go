package placer

import (
	"context"
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// TestReasonWrittenAfterAQueueEntryMoved: a pass's reason for a waiting
// session is written in a nested transaction that applies only while the
// session's queue entry is at the revision planned. When the entry moved
// in between (the lifecycle controller writes a preemption's hold into
// its preemptor's entry), nothing is written, and the next pass, planned
// on the new entry, must write the same reason. Remembering the refused
// write as done (the writer before this test) kept the session at
// "waiting for the placer" until its reason changed: under a loaded race
// run, TestReclaimBorrowedGPUsForATeam saw vision-1 bound after 3 s
// without a reason.
func TestReasonWrittenAfterAQueueEntryMoved(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx := context.Background()
	s := newSim(t, cli)
	id := s.submit(ctx, "ada", []int{4}, nil)[0]
	k := s.k
	p := New(cli, Config{ID: "placer-a"})
	entry := func() Pending {
		resp, err := cli.Get(ctx, k.Pending(id))
		if err != nil || len(resp.Kvs) == 0 {
			t.Fatalf("queue entry of %s: %v", id, err)
		}
		e, err := state.Decode[state.QueueEntry](resp.Kvs[0].Value)
		if err != nil {
			t.Fatal(err)
		}
		return Pending{Entry: &e, Revision: resp.Kvs[0].ModRevision}
	}
	reason := "waiting for 4×GPU: the best node has 0 free"
	pass := func(pd Pending) advice {
		return advice{plan: &Plan{Waiting: []Waiting{{Pending: &pd, Position: 1, Reason: "Capacity", Message: reason}}}, owners: []string{"placer-a"}}
	}
	message := func() string {
		st, _, err := state.Get[state.Status](ctx, cli, k.Status(id))
		if err != nil {
			t.Fatal(err)
		}
		return st.Message
	}

	planned := entry()
	// The entry moves after the plan read it: the same request, rewritten.
	if _, err := cli.Put(ctx, k.Pending(id), mustEncode(t, *planned.Entry)); err != nil {
		t.Fatal(err)
	}
	p.writeWaiting(ctx, pass(planned))
	if m := message(); strings.Contains(m, reason) {
		t.Fatalf("status %q written over a queue entry that moved since the plan", m)
	}
	p.writeWaiting(ctx, pass(entry()))
	if m := message(); !strings.Contains(m, reason) {
		t.Fatalf("status %q after a pass on the current entry, want the reason %q", m, reason)
	}
}

func mustEncode(t *testing.T, v any) string {
	t.Helper()
	s, err := state.Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
