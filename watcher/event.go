package watcher

import "fmt"

// EventType says what happened to a key.
type EventType int

// The kinds of change a handler sees.
const (
	// Added: the key was absent from the cache and now holds a value.
	Added EventType = iota + 1
	// Modified: the key held a value and now holds another (or the same
	// bytes written again).
	Modified
	// Deleted: the key held a value and is now absent, because it was
	// deleted in etcd or because its new value does not decode.
	Deleted
)

// String returns "added", "modified" or "deleted".
func (t EventType) String() string {
	switch t {
	case Added:
		return "added"
	case Modified:
		return "modified"
	case Deleted:
		return "deleted"
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// Event is one change to one key, as the cache applied it.
type Event[T any] struct {
	Type EventType
	Key  string
	// Value is the new value; for Deleted, the last value the cache held.
	Value T
	// Prev is the value the cache held before this change: nil for Added,
	// the old value for Modified, the same as Value for Deleted.
	Prev *T
	// Revision is the etcd revision of the change: the key's new
	// ModRevision for Added and Modified, the revision of the delete for
	// Deleted. For a synthetic Deleted (found missing by a relist) it is the
	// relist's revision.
	Revision int64
	// Synthetic is true when the event was computed from a full list (the
	// first list, or a relist after compaction) rather than read from the
	// watch stream. Such an event stands for the net change since the
	// previous state; intermediate values were not observed.
	Synthetic bool
}

// Item is one key of the cache with its decoded value.
type Item[T any] struct {
	Key   string
	Value T
	// ModRevision is the revision of the key's last change, as etcd
	// reports it: compare it in a transaction to act only on this version.
	ModRevision int64
	// CreateRevision is the revision the key was (last) created at; it
	// changes when a key is deleted and created again.
	CreateRevision int64
	// Version counts the key's changes since it was created: 1 for a new
	// key (etcd's version).
	Version int64
}

// SyncInfo describes one full list that the cache has applied.
type SyncInfo struct {
	// Revision is the etcd revision the list was read at.
	Revision int64
	// Initial is true for the first list after Run starts and false for a
	// relist (after the watch revision was compacted, or after the cache
	// found itself out of step with etcd).
	Initial bool
	// Added, Modified and Deleted count the synthetic events the list
	// produced.
	Added, Modified, Deleted int
}
