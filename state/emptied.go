package state

import (
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// dirEmptied holds one record per node: when its ledger was last emptied.
const dirEmptied = "emptied"

// Emptied is emptied/<node>: when the node's last allocation went, written
// in the same transaction that deletes the node's ledger (an agent's
// release, the placer's node-loss handling). The ledger key is deleted when
// it holds nothing, so its deletion leaves no revision to read back; this
// record is that moment, kept in etcd so that whoever reads it (the API's
// node view) gives the same answer after any restart. Since is the
// writer's clock; the key's mod revision is the revision of the deletion.
// A ledger present again makes the record stale until the next emptying
// rewrites it: a node is empty only while it has no ledger.
type Emptied struct {
	Node  string    `json:"node"`
	Since time.Time `json:"since"`
}

// EmptiedDir is the prefix of every node's Emptied record.
func (k Keys) EmptiedDir() string { return k.dir(dirEmptied) }

// Emptied is the key of node's Emptied record.
func (k Keys) Emptied(node string) string { return k.key(dirEmptied, node) }

// EmptiedNode returns the node name of a key under emptied/.
func (k Keys) EmptiedNode(key string) (string, bool) {
	if !k.hasDir(dirEmptied, key) {
		return "", false
	}
	n := k.trimDir(dirEmptied, key)
	return n, n != "" && !strings.Contains(n, "/")
}

// EmptiedOp is the put of node's Emptied record at now, for the
// transaction that deletes the node's ledger.
func EmptiedOp(k Keys, node string, now time.Time) (clientv3.Op, error) {
	v, err := Encode(Emptied{Node: node, Since: now.UTC()})
	if err != nil {
		return clientv3.Op{}, fmt.Errorf("encode emptied record of %s: %w", node, err)
	}
	return clientv3.OpPut(k.Emptied(node), v), nil
}

// EmptySince is since when node has held nothing, given its ledger's
// presence, its Emptied record (ok: one was read) and when its agent
// registered it: never while a ledger exists; otherwise the later of the
// record and the registration, since an agent that registered after the
// record (a node that came back, or whose ledger a node loss cleared) has
// run nothing only since then. The second result is false while the node
// holds something.
func EmptySince(ledger bool, rec Emptied, ok bool, registered time.Time) (time.Time, bool) {
	if ledger {
		return time.Time{}, false
	}
	since := registered
	if ok && rec.Since.After(since) {
		since = rec.Since
	}
	return since, true
}
