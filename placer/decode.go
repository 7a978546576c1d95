package placer

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	gojson "github.com/goccy/go-json"

	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// The shared caches decode with these instead of plain JSON: the values
// are the same, but strings that thousands of values repeat (owners,
// kinds, GPU models, NVLink peers) are stored once. At 100,000 queued
// sessions and 10,000 nodes each repeat was its own allocation (issue 16).

// internMax caps how many distinct strings the intern table keeps: the
// values interned (owners, groups, kinds, roles, GPU models, MIG profiles,
// node names) are few at any site, but a table that never forgets would
// grow with every one a long-lived process has seen.
const internMax = 1 << 16

// interned is the intern table: each string once, by value. It holds its
// strings strongly. unique.Make, tried first, did not: its table keeps a
// string only while a unique.Handle to it lives, and the decoders keep the
// string, not the handle, so after each collection every interned value
// was stored again (a weak pointer and a cleanup each time: 16 ms of a
// 3,000-session burst's ledger decoding, at 1,000 nodes).
var interned struct {
	m sync.Map // string → string
	n atomic.Int64
}

// intern returns the table's copy of s; never s itself, which may point
// into a decoder's copy of a whole value. Once the table holds internMax
// strings, a string it does not hold is returned as a copy of its own.
func intern[S ~string](s S) S {
	if s == "" {
		return s
	}
	if v, ok := interned.m.Load(string(s)); ok {
		return S(v.(string))
	}
	c := strings.Clone(string(s))
	if interned.n.Load() >= internMax {
		return S(c)
	}
	v, loaded := interned.m.LoadOrStore(c, c)
	if !loaded {
		interned.n.Add(1)
	}
	return S(v.(string))
}

// internAll interns every string of ss in place.
func internAll(ss []string) {
	for i, s := range ss {
		ss[i] = intern(s)
	}
}

// cloneAll replaces every string of ss with a copy of its own.
func cloneAll(ss []string) {
	for i, s := range ss {
		ss[i] = strings.Clone(s)
	}
}

// internResources interns r's repeated strings in place.
func internResources(r *state.Resources) {
	r.GPUModel = intern(r.GPUModel)
	r.MIGProfile = intern(r.MIGProfile)
}

// decodeFixed decodes a stored T, then lets fix store its repeated
// strings once.
func decodeFixed[T any](fix func(key string, v *T)) watcher.DecodeFunc[T] {
	return func(key string, value []byte) (T, error) {
		v, err := state.Decode[T](value)
		if err != nil {
			return v, fmt.Errorf("decode %s: %w", key, err)
		}
		fix(key, &v)
		return v, nil
	}
}

// decodeQueueEntry decodes pending/<id>. The session id shares the key's
// memory.
func decodeQueueEntry(keys state.Keys) watcher.DecodeFunc[state.QueueEntry] {
	return decodeFixed(func(key string, e *state.QueueEntry) {
		if id, ok := keys.SessionID(key); ok {
			// The key names the session, and shares its memory: which
			// says, to SnapshotOf, that the key was found to name one
			// (isKeyTail).
			e.Session = id
		}
		e.Kind = intern(e.Kind)
		e.Owner = intern(e.Owner)
		internAll(e.Groups)
		internResources(&e.Request)
		if e.WorkerRequest != nil {
			internResources(e.WorkerRequest)
		}
	})
}

// decodeNode decodes nodes/<name>. A GPU's NVLink peers are the node's
// other GPUs: each peer shares that GPU's UUID string.
var decodeNode = decodeFixed(func(_ string, n *state.Node) {
	for i := range n.GPUs {
		g := &n.GPUs[i]
		g.Model = intern(g.Model)
		for j, peer := range g.NVLinkPeers {
			for _, other := range n.GPUs {
				if other.UUID == peer {
					g.NVLinkPeers[j] = other.UUID
					break
				}
			}
		}
		for j := range g.MIGDevices {
			g.MIGDevices[j].Profile = intern(g.MIGDevices[j].Profile)
		}
	}
})

// decodeLedger decodes ledger/<node>. Every placer decodes every ledger
// write (a burst rewrites each node's ledger), so it reads with
// goccy/go-json, about 4x faster than encoding/json (17 µs to 4.5 for a
// ledger of five allocations). That decoder's strings point into its copy
// of the whole input, so none is kept: owners, groups, kinds and roles are
// interned (a site has few of each), and the device UUIDs (with their
// physical GPUs, Parents) and the session ids that key the allocations
// copied (TestDecodeLedgerKeepsNotItsInput).
func decodeLedger(key string, value []byte) (state.Ledger, error) {
	var l state.Ledger
	if err := gojson.Unmarshal(value, &l); err != nil {
		return l, fmt.Errorf("decode %s: %w", key, err)
	}
	l.Node = intern(l.Node)
	if l.Allocations == nil {
		return l, nil
	}
	allocs := make(map[string]state.Allocation, len(l.Allocations))
	for id, a := range l.Allocations {
		a.Kind = intern(a.Kind)
		a.Owner = intern(a.Owner)
		a.Role = intern(a.Role)
		internAll(a.Groups)
		cloneAll(a.GPUs) // each device's UUID is in one allocation only
		if len(a.Parents) > 0 {
			parents := make(map[string]string, len(a.Parents))
			for d, g := range a.Parents {
				parents[strings.Clone(d)] = strings.Clone(g)
			}
			a.Parents = parents
		}
		allocs[strings.Clone(id)] = a
	}
	l.Allocations = allocs
	return l, nil
}

// isKeyTail reports whether id is the tail of key in key's own memory:
// how decodeQueueEntry leaves an entry whose key names a session (no
// other decoder makes a value's string out of its key). It reads only the
// two strings' headers: a snapshot of 20,000 queue entries spent half its
// time reading each key again to find the id it already held.
func isKeyTail(key, id string) bool {
	return id != "" && len(id) < len(key) &&
		unsafe.StringData(id) == (*byte)(unsafe.Add(unsafe.Pointer(unsafe.StringData(key)), len(key)-len(id)))
}
