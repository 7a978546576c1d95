package nodeagent_test

import (
	"context"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// TestPartOfAnEndedJobNeverLaunches: a part whose session ended before it
// launched (as a multi-node job's part does when rank 0 exited on another
// node and the merger ended the job) is released without its container
// ever being created: state.Launch refuses it (ErrEnded). Before, the
// part launched and ran after its session had ended (the soak's
// launched-twice rule found it in multi-node jobs).
func TestPartOfAnEndedJobNeverLaunches(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	rt := newFake()
	s := state.Session{ID: "ended1", Owner: "ada", Kind: state.KindBatch, Image: "busybox", Command: []string{"job"},
		Resources: state.Resources{CPUMilli: 100, MemoryMiB: 64}}
	b := bind(t, cli, s, state.Binding{CPUMilli: 100, MemoryMiB: 64})
	// The session ended before its agent came to launch it.
	now := time.Now().UTC()
	code := 0
	if _, err := state.Put(ctx, cli, keys.Status(s.ID), state.Status{Session: s.ID, Phase: state.PhaseSucceeded, Reason: "Exited",
		Nodes: []string{node}, QueueRevision: b.QueueRevision, ExitCode: &code, Created: now, Updated: now, Finished: &now}); err != nil {
		t.Fatal(err)
	}
	runAgent(t, testConfig(t, cli, rt))
	waitFor(t, "the part's binding released", 20*time.Second, func() (bool, string) {
		return gone(t, cli, keys.Binding(node, s.ID)), "binding still there"
	})
	if n := rt.Starts(); n != 0 {
		t.Errorf("%d containers started for a part of an ended job; want none", n)
	}
	if r, err := cli.Get(ctx, keys.Ledger(node)); err != nil {
		t.Fatal(err)
	} else if len(r.Kvs) > 0 {
		l, err := state.Decode[state.Ledger](r.Kvs[0].Value)
		if err != nil {
			t.Fatal(err)
		}
		if _, held := l.Allocations[s.ID]; held {
			t.Errorf("the ended job's part still holds its allocation")
		}
	}
}
