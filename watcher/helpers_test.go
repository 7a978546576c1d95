package watcher_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/watcher"
)

// val is the value type the tests store, as JSON.
type val struct {
	V string `json:"v"`
}

// eventually polls cond until it holds, failing the test after a deadline.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond) // poll interval, not a stand-in for a condition
	}
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func testOptions(t testing.TB) watcher.Options {
	return watcher.Options{
		Name:       t.Name(),
		Logger:     testLogger(t),
		BackoffMin: time.Millisecond,
		BackoffMax: 20 * time.Millisecond,
	}
}

// run starts c.Run, waits for the first sync and, at cleanup, cancels Run
// and checks it returned nil. Call it after starting etcd so that the cache
// stops first.
func run[T any](t *testing.T, c *watcher.Cache[T]) {
	t.Helper()
	t.Cleanup(runUntil(t, c))
}

// runUntil starts c.Run and waits for the first sync. The returned stop
// cancels Run and checks it returned nil; it may be called more than once.
func runUntil[T any](t *testing.T, c *watcher.Cache[T]) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-errc:
				if err != nil {
					t.Errorf("Run returned %v, want nil", err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("Run did not return after cancel")
			}
		})
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := c.WaitSynced(wctx); err != nil {
		stop()
		t.Fatalf("WaitSynced: %v", err)
	}
	return stop
}

// caughtUp waits until the cache reflects etcd's current revision.
func caughtUp[T any](t *testing.T, cli *clientv3.Client, c *watcher.Cache[T]) {
	t.Helper()
	resp, err := cli.Get(context.Background(), "caught-up-probe")
	if err != nil {
		t.Fatalf("get revision: %v", err)
	}
	rev := resp.Header.Revision
	eventually(t, "cache at current revision", func() bool { return c.Revision() >= rev })
}

// faultClient is a watcher.Client whose watches go through a faultWatcher.
type faultClient struct {
	clientv3.KV
	*faultWatcher
}

type breakMode int

const (
	closeStream    breakMode = iota // the watch channel closes
	cancelStream                    // a Canceled response, then close
	noLeaderStream                  // a Canceled response with "no leader", then close
)

// faultWatcher passes watches to a real etcd watcher and lets a test break
// the streams it handed out, and hold new watches until released.
type faultWatcher struct {
	real clientv3.Watcher

	mu      sync.Mutex
	streams map[*faultStream]struct{}
	hold    chan struct{} // non-nil: new watches wait until it is closed

	watches atomic.Int64 // Watch calls
	held    atomic.Int64 // watches waiting on hold now
	// lose, when set, picks events the streams lose: each is taken out
	// of its response, as if etcd had never sent it.
	lose atomic.Pointer[func(*clientv3.Event) bool]
}

type faultStream struct {
	breakc chan breakMode
}

func newFaultWatcher(real clientv3.Watcher) *faultWatcher {
	return &faultWatcher{real: real, streams: map[*faultStream]struct{}{}}
}

func (f *faultWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	f.watches.Add(1)
	out := make(chan clientv3.WatchResponse)
	f.mu.Lock()
	hold := f.hold
	f.mu.Unlock()
	go func() {
		defer close(out)
		if hold != nil {
			f.held.Add(1)
			select {
			case <-hold:
				f.held.Add(-1)
			case <-ctx.Done():
				f.held.Add(-1)
				return
			}
		}
		ictx, cancel := context.WithCancel(ctx)
		defer cancel()
		in := f.real.Watch(ictx, key, opts...)
		s := &faultStream{breakc: make(chan breakMode, 1)}
		f.mu.Lock()
		f.streams[s] = struct{}{}
		f.mu.Unlock()
		defer func() {
			f.mu.Lock()
			delete(f.streams, s)
			f.mu.Unlock()
		}()
		broken := func(m breakMode) {
			var resp clientv3.WatchResponse
			switch m {
			case closeStream:
				return
			case cancelStream:
				resp = clientv3.WatchResponse{Canceled: true, CancelReason: "injected fault"}
			case noLeaderStream:
				resp = clientv3.WatchResponse{Canceled: true, CancelReason: "etcdserver: no leader"}
			}
			select {
			case out <- resp:
			case <-ctx.Done():
			}
		}
		for {
			var resp clientv3.WatchResponse
			var ok bool
			select {
			case m := <-s.breakc:
				broken(m)
				return
			case <-ctx.Done():
				return
			case resp, ok = <-in:
				if !ok {
					return
				}
			}
			if lose := f.lose.Load(); lose != nil && len(resp.Events) > 0 {
				kept := make([]*clientv3.Event, 0, len(resp.Events))
				for _, ev := range resp.Events {
					if !(*lose)(ev) {
						kept = append(kept, ev)
					}
				}
				resp.Events = kept
			}
			select {
			case out <- resp:
			case m := <-s.breakc:
				broken(m) // resp is lost, as on a real broken stream
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// active is the number of streams currently open.
func (f *faultWatcher) active() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.streams)
}

// breakAll breaks every open stream.
func (f *faultWatcher) breakAll(m breakMode) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.streams {
		select {
		case s.breakc <- m:
		default:
		}
	}
}

// holdNew makes new watches wait until release.
func (f *faultWatcher) holdNew() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hold == nil {
		f.hold = make(chan struct{})
	}
}

func (f *faultWatcher) release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hold != nil {
		close(f.hold)
		f.hold = nil
	}
}
