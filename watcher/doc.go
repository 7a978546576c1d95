// Package watcher keeps a typed, always-current copy of one etcd key prefix:
// it lists the prefix at one revision, then watches from the next revision,
// and hands every change to the handlers in revision order, exactly once.
//
// # How it stays exact
//
// The list is paged (Options.PageSize keys per request) and every page after
// the first is read at the first page's revision, so the cache starts from one
// consistent snapshot even while others write. Each page is decoded as it
// arrives and then dropped, so a prefix of 100,000 keys is never held raw
// beside its decoded copy; the cache publishes the list only once the last
// page is in. The watch then starts at that
// revision + 1 and requires a leader (clientv3.WithRequireLeader).
//
// When the stream breaks (the channel closes, or etcd cancels the watch, for
// example with "no leader"), the cache waits a bounded, jittered, exponential
// backoff and watches again from the revision after the last one it applied
// (events, or a progress notification). etcd never splits one revision over
// two responses, so nothing is missed; an event at or below the cache's
// revision is dropped, so nothing is applied twice. Each put is checked
// against the cache: it must be the key's next version (etcd counts them
// from 1 at a key's creation), and a version that does not follow (a missed
// change) causes a relist. The watch does not ask for previous values
// (clientv3.WithPrevKV), which etcd reads back from its store for every
// event it sends: 5–10% of the process's CPU in a burst of binds.
//
// A watch response's header revision is not used as the resume point: a
// watcher catching up may get a batch of events that stops short of it.
//
// When that revision has been compacted away, the cache lists the prefix
// again at the current revision and delivers the difference between what it
// held and the fresh list as synthetic events (Event.Synthetic): Added,
// Modified or Deleted, one per changed key. Values a key took between the two
// points are gone from etcd and are not replayed; handlers see the net change
// only, and their view converges to the fresh list. OnSync hooks run after
// every full list, so consumers that keep derived state know a relist
// happened.
//
// # What readers get
//
// Values are decoded once, when the change arrives. A value that does not
// decode is logged, counted (Cache.DecodeErrors) and treated as absent.
// Cache.Snapshot returns an immutable view at one revision that may be kept
// and read from any goroutine without locks while the cache moves on. A
// snapshot is split into 4,096 small maps, in 64 groups, holding pointers
// to items: a batch of changes copies only the groups and maps it touches,
// a key and a pointer per entry, and snapshots share every item that did
// not change.
//
// The package knows nothing of any key schema: the caller chooses the
// prefix and the decode function.
package watcher
