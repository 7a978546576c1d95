package lifecycle

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/history"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/state"
)

// TestFractionPreemptsAnotherOwnersFractionEndToEnd: on a real etcd with
// a placer, the controller and an agent whose GPU 0 alone is shared (the
// other seven whole and busy), bob's preemptible low-priority fraction
// holds the shared GPU. Ada's urgent fraction fits its memory but may not
// join bob's (one owner per shared GPU), so bob's fraction is warned,
// stopped and re-queued, and ada's runs on the shared GPU; bob's waits
// while the GPU is ada's. The history checker follows the whole run and
// finds no violation (fractions within the GPU and of one owner, nothing
// whole beside them, every transition legal).
func TestFractionPreemptsAnotherOwnersFractionEndToEnd(t *testing.T) {
	c := newChain(t, ControllerConfig{PreemptGrace: 300 * time.Millisecond}, func(cfg *nodeagent.Config) {
		cfg.GPUs[0].Shared = true
	})
	frac := func(owner string, mib int64) func(*state.Session) {
		return func(s *state.Session) {
			s.Owner = owner
			s.Resources = state.Resources{GPUs: 1, GPUShareMiB: mib, CPUMilli: 1000, MemoryMiB: 1024}
		}
	}
	// The seven whole GPUs busy with work nobody may preempt.
	c.submit("whole", 7, 0, false, nil)
	c.running("whole")
	c.submit("bob-nb", 0, 0, true, frac("bob", 20000))
	c.running("bob-nb")
	c.submit("vip", 0, 10, false, frac("ada", 20000))
	w, _ := waitKey(t, c.cli, keys.Warning("bob-nb"), "bob's preemption warning", func(w state.Warning, found bool) bool { return found })
	if w.Reason != state.ReasonPreempted || w.By != "vip" || w.Node != chainNode {
		t.Fatalf("warning %+v; want bob-nb preempted by vip on %s", w, chainNode)
	}
	c.running("vip")
	l, _, err := state.Get[state.Ledger](context.Background(), c.cli, keys.Ledger(chainNode))
	if err != nil {
		t.Fatal(err)
	}
	a, ok := l.Allocations["vip"]
	if !ok || a.Share == nil || a.Share.MemoryMiB != 20000 || len(a.GPUs) != 1 {
		t.Fatalf("vip's allocation %+v; want a 20000 MiB fraction", a)
	}
	if _, held := l.Allocations["bob-nb"]; held {
		t.Fatalf("bob-nb still holds its fraction beside vip's: %+v", l.Allocations)
	}
	st := c.status("bob-nb", "re-queued", func(st state.Status) bool {
		return st.Phase == state.PhasePending && st.Reason != state.ReasonPreempted
	})
	if r, _ := c.cli.Get(context.Background(), keys.Pending("bob-nb")); len(r.Kvs) == 0 {
		t.Fatalf("bob-nb is not in the queue after its preemption: %+v", st)
	}
	// The whole history, from the first revision.
	r, err := c.cli.Get(context.Background(), keys.All(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	res, err := history.Watch(context.Background(), c.cli, keys, history.Options{Start: 1, End: r.Header.Revision})
	if err != nil {
		t.Fatal(err)
	}
	if res.Count > 0 {
		t.Fatalf("the history checker found %d violations: %v", res.Count, res.Violations)
	}
	t.Logf("history checked over revisions %d-%d", res.Start, res.Last)
}
