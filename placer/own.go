package placer

import (
	"bytes"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// ownWrites are this placer's committed binds that its watch caches may not
// show yet. A bind transaction's writes all carry its revision: while a
// cache is older than that revision it cannot hold anything newer for those
// keys, so the bind's ledgers are the newest there are and its sessions'
// pending keys are gone. Laying them over the caches lets the next pass plan
// on the state this placer made, instead of waiting for the watch to
// deliver it (at a large site the caches trail a burst of binds by seconds)
// or re-planning sessions it has bound into transactions that all conflict.
// An entry is dropped once its cache reaches its revision.
type ownWrites struct {
	mu      sync.Mutex
	ledgers map[string]ownLedger // by node name
	bound   map[string]int64     // session id → the revision that bound it
	// revs are the revisions of the binds recorded, until both caches
	// show them: their events are this placer's own writes coming back.
	revs map[int64]bool
	// sent are the ledger values of bind transactions sent and not yet
	// seen by the ledgers cache's decoder, by ledger key: a value that
	// comes back byte for byte is the ledger it was encoded from, which
	// the decoder then need not read (sentLedger).
	sent map[string]sentLedger
	// taken counts the ledger values the decoder took from sent.
	taken int64
}

// sentLedger is a ledger as this placer encoded it into a bind.
type sentLedger struct {
	value  []byte
	ledger state.Ledger
	rev    int64 // the bind's revision once committed; 0 before
}

type ownLedger struct {
	ledger state.Ledger
	rev    int64
}

func newOwnWrites() *ownWrites {
	return &ownWrites{ledgers: map[string]ownLedger{}, bound: map[string]int64{}, revs: map[int64]bool{}, sent: map[string]sentLedger{}}
}

// send remembers the ledger values of a bind about to be sent: ops[i]
// writes lws[i] (state.BindOps). The ledgers' maps must not change
// afterwards.
func (o *ownWrites) send(lws []state.LedgerWrite, ops []clientv3.Op) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := range lws {
		o.sent[string(ops[i].KeyBytes())] = sentLedger{value: ops[i].ValueBytes(), ledger: lws[i].Ledger}
	}
}

// unsend forgets the ledger values of a bind that did not commit.
func (o *ownWrites) unsend(ops []clientv3.Op, n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := range n {
		key := string(ops[i].KeyBytes())
		if sl, ok := o.sent[key]; ok && sl.rev == 0 && bytes.Equal(sl.value, ops[i].ValueBytes()) {
			delete(o.sent, key)
		}
	}
}

// sentLedger returns the ledger that this placer encoded as value, if value
// is byte for byte a ledger value it sent for key, and forgets it: equal
// bytes decode to an equal ledger, whoever wrote them. The watch delivers
// each write once; a list after it decodes as usual.
func (o *ownWrites) sentLedger(key string, value []byte) (state.Ledger, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	sl, ok := o.sent[key]
	if !ok || !bytes.Equal(sl.value, value) {
		return state.Ledger{}, false
	}
	delete(o.sent, key)
	o.taken++
	return sl.ledger, true
}

// record remembers a committed bind at rev: the ledgers as written and the
// sessions bound; ops are the bind's operations (ops[i] writes lws[i]), as
// sent (send), or nil. The ledgers' maps must not change afterwards.
func (o *ownWrites) record(lws []state.LedgerWrite, ps []state.Placement, rev int64, ops []clientv3.Op) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, lw := range lws {
		if cur, ok := o.ledgers[lw.Node]; !ok || cur.rev < rev {
			o.ledgers[lw.Node] = ownLedger{ledger: lw.Ledger, rev: rev}
		}
	}
	for _, pl := range ps {
		o.bound[pl.Session] = max(o.bound[pl.Session], rev)
	}
	for i := range min(len(lws), len(ops)) {
		// The bind's values the decoder has not taken yet: forgotten
		// once the cache is past rev (overlay).
		key := string(ops[i].KeyBytes())
		if sl, ok := o.sent[key]; ok && sl.rev == 0 && bytes.Equal(sl.value, ops[i].ValueBytes()) {
			sl.rev = rev
			o.sent[key] = sl
		}
	}
	o.revs[rev] = true
}

// isOwn reports whether rev is the revision of a bind recorded here and not
// yet forgotten (overlay forgets it once both caches show it): every change
// at rev is that transaction's, this placer's own write.
func (o *ownWrites) isOwn(rev int64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.revs[rev]
}

// ledger returns this placer's write of node's ledger and its revision
// when the ledgers cache, at cacheRev, cannot show it yet.
func (o *ownWrites) ledger(node string, cacheRev int64) (state.Ledger, int64, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if l, ok := o.ledgers[node]; ok && l.rev > cacheRev {
		return l.ledger, l.rev, true
	}
	return state.Ledger{}, 0, false
}

// overlay lays the writes the caches (ledgers at ledgersRev, pending at
// pendingRev) do not show yet over s, and forgets the ones they show.
func (o *ownWrites) overlay(s *Snapshot, ledgersRev, pendingRev int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for node, l := range o.ledgers {
		if l.rev <= ledgersRev {
			delete(o.ledgers, node)
		}
	}
	for id, rev := range o.bound {
		if rev <= pendingRev {
			delete(o.bound, id)
		}
	}
	for rev := range o.revs {
		if rev <= min(ledgersRev, pendingRev) {
			delete(o.revs, rev)
		}
	}
	for key, sl := range o.sent {
		if sl.rev != 0 && sl.rev <= ledgersRev {
			delete(o.sent, key) // the cache read it without asking, or a newer value
		}
	}
	if len(o.ledgers) > 0 {
		for i := range s.Nodes {
			v := &s.Nodes[i]
			if l, ok := o.ledgers[v.Node.Name]; ok {
				v.Ledger, v.LedgerRevision = l.ledger, l.rev
			}
		}
	}
	if len(o.bound) > 0 {
		kept := s.Pending[:0]
		for _, it := range s.Pending {
			// The cache is older than the bind, so this entry is the one
			// the bind deleted (a re-queue would come after it).
			if _, gone := o.bound[it.Entry.Session]; !gone {
				kept = append(kept, it)
			}
		}
		s.Pending = kept
	}
}

// freshLedger returns the newest ledger of node this placer knows: its own
// write while the cache (snapshot fresh) cannot show it, else the cache's.
func (p *Placer) freshLedger(fresh *watcher.Snapshot[state.Ledger], node string) (watcher.Item[state.Ledger], bool) {
	if l, rev, ok := p.own.ledger(node, fresh.Revision()); ok {
		return watcher.Item[state.Ledger]{Key: p.cfg.Keys.Ledger(node), Value: l, ModRevision: rev}, true
	}
	return fresh.Item(p.cfg.Keys.Ledger(node))
}

// cacheLag is how many revisions the pending or ledger cache trails this
// placer's newest bind; 0 when both show it.
func (p *Placer) cacheLag() int64 {
	return max(0, p.lastBind.Load()-min(p.pending.Revision(), p.ledgers.Revision()))
}
