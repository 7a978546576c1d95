package placer

import (
	"reflect"
	"slices"
	"testing"

	"github.com/voyager-gpu/voyager/state"
)

// TestOwnWritesOverlay: a placer's committed bind is laid over caches that
// are older than it (its ledger replaces the cached one, its session leaves
// the queue, so the next pass neither re-plans it nor writes over a stale
// ledger), and forgotten once the caches reach its revision; a session
// queued again after the bind stays queued.
func TestOwnWritesOverlay(t *testing.T) {
	n := gpuNode("n1", 8, "A100")
	bound := holding(view(n), "s1", "ada", 4).Ledger
	bind := func(o *ownWrites) {
		o.record([]state.LedgerWrite{{Node: "n1", Ledger: bound}}, []state.Placement{{Session: "s1"}}, 10, nil)
	}
	cases := []struct {
		name                    string
		ledgersRev, pendingRev  int64
		pendingS1Rev            int64 // s1's pending entry in the cache (its ModRevision)
		wantLedgerRev           int64
		wantS1Queued            bool
		wantLedgersKept, wantS1 bool // still remembered afterwards
	}{
		{name: "caches older than the bind", ledgersRev: 9, pendingRev: 9, pendingS1Rev: 3, wantLedgerRev: 10, wantS1Queued: false, wantLedgersKept: true, wantS1: true},
		{name: "caches at the bind", ledgersRev: 10, pendingRev: 10, wantLedgerRev: 5, wantS1Queued: false},
		{name: "ledgers caught up, pending not", ledgersRev: 12, pendingRev: 9, pendingS1Rev: 3, wantLedgerRev: 5, wantS1Queued: false, wantS1: true},
		{name: "queued again after the bind", ledgersRev: 14, pendingRev: 14, pendingS1Rev: 13, wantLedgerRev: 5, wantS1Queued: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := newOwnWrites()
			bind(o)
			v := view(n)
			v.LedgerRevision = 5
			s := snap([]NodeView{v}, req("s2", "bob", 1, 0))
			if tc.pendingS1Rev > 0 {
				p := req("s1", "ada", 4, 0)
				p.Revision = tc.pendingS1Rev
				s.Pending = append(s.Pending, p)
			}
			o.overlay(s, tc.ledgersRev, tc.pendingRev)
			if got := s.Nodes[0].LedgerRevision; got != tc.wantLedgerRev {
				t.Errorf("ledger revision %d, want %d", got, tc.wantLedgerRev)
			}
			if tc.wantLedgerRev == 10 && len(s.Nodes[0].Ledger.Allocations["s1"].GPUs) != 4 {
				t.Errorf("overlaid ledger %+v, want s1 holding 4 GPUs", s.Nodes[0].Ledger)
			}
			queued := map[string]bool{}
			for _, p := range s.Pending {
				queued[p.Entry.Session] = true
			}
			if !queued["s2"] || queued["s1"] != tc.wantS1Queued {
				t.Errorf("queued %v, want s2 and s1=%v", queued, tc.wantS1Queued)
			}
			_, _, kept := o.ledger("n1", 0)
			_, s1 := o.bound["s1"]
			if kept != tc.wantLedgersKept || s1 != tc.wantS1 {
				t.Errorf("remembered ledger %v, s1 %v; want %v, %v", kept, s1, tc.wantLedgersKept, tc.wantS1)
			}
		})
	}
}

func TestDropBoundKeepsOnlyWhatNoLaterLedgerHolds(t *testing.T) {
	a := view(gpuNode("a", 8, "A100"))
	a.Ledger.Allocations["bound"] = state.Allocation{Owner: "ada", GPUs: []string{a.Node.GPUs[0].UUID}}
	a.Ledger.Allocations["requeued"] = state.Allocation{Owner: "ada", GPUs: []string{a.Node.GPUs[1].UUID}}
	a.LedgerRevision = 50
	bound, requeued, waiting := req("bound", "ada", 1, 0), req("requeued", "ada", 1, 0), req("waiting", "ada", 1, 0)
	bound.Revision, requeued.Revision, waiting.Revision = 40, 60, 45
	s := snap([]NodeView{a}, bound, requeued, waiting)
	dropBound(s)
	var ids []string
	for _, it := range s.Pending {
		ids = append(ids, it.Entry.Session)
	}
	if !slices.Equal(ids, []string{"requeued", "waiting"}) {
		t.Fatalf("queue %v after dropBound; want requeued (queued after the ledger listing it) and waiting", ids)
	}
}

// TestSentLedgerIsTakenOnce: a ledger value that comes back byte for byte
// as it was sent is taken as the ledger it was encoded from, once; other
// bytes for the key, a bind that did not commit, and a value the cache has
// read past are not.
func TestSentLedgerIsTakenOnce(t *testing.T) {
	k := state.MustKeys(state.DefaultPrefix)
	n := gpuNode("n1", 8, "A100")
	lws := []state.LedgerWrite{{Node: "n1", Ledger: holding(view(n), "s1", "ada", 4).Ledger}}
	_, ops, err := state.BindOps(k, lws, []state.Placement{{Session: "s1", PendingRevision: 3}})
	if err != nil {
		t.Fatal(err)
	}
	key, value := k.Ledger("n1"), ops[0].ValueBytes()
	if string(ops[0].KeyBytes()) != key {
		t.Fatalf("ops[0] writes %s, want the ledger %s", ops[0].KeyBytes(), key)
	}
	same := func(a, b state.Ledger) bool {
		return reflect.ValueOf(a.Allocations).UnsafePointer() == reflect.ValueOf(b.Allocations).UnsafePointer()
	}

	o := newOwnWrites()
	o.send(lws, ops)
	if _, ok := o.sentLedger(key, append([]byte(nil), value[:len(value)-1]...)); ok {
		t.Errorf("other bytes for the key were taken as the sent ledger")
	}
	if _, ok := o.sentLedger(k.Ledger("n2"), value); ok {
		t.Errorf("the bytes under another key were taken as the sent ledger")
	}
	got, ok := o.sentLedger(key, append([]byte(nil), value...))
	if !ok || !same(got, lws[0].Ledger) {
		t.Fatalf("the sent bytes were not taken as the sent ledger")
	}
	if _, ok := o.sentLedger(key, value); ok {
		t.Errorf("a sent ledger was taken twice")
	}
	if o.taken != 1 {
		t.Errorf("taken = %d, want 1", o.taken)
	}

	o.send(lws, ops)
	o.unsend(ops, len(lws))
	if _, ok := o.sentLedger(key, value); ok {
		t.Errorf("the ledger of a bind that did not commit was taken")
	}

	o.send(lws, ops)
	o.record(lws, []state.Placement{{Session: "s1"}}, 10, ops)
	o.overlay(&Snapshot{}, 9, 9)
	if _, ok := o.sentLedger(key, value); !ok {
		t.Errorf("a committed ledger was forgotten before the cache reached its revision")
	}
	o.send(lws, ops)
	o.record(lws, []state.Placement{{Session: "s1"}}, 11, ops)
	o.overlay(&Snapshot{}, 11, 11)
	if _, ok := o.sentLedger(key, value); ok {
		t.Errorf("a committed ledger was still taken after the cache read past its revision")
	}
}
