package watcher

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// noClient stands in for etcd where a benchmark drives the cache directly.
type noClient struct{}

func (noClient) Get(context.Context, string, ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	panic("not used")
}

func (noClient) Watch(context.Context, string, ...clientv3.OpOption) clientv3.WatchChan {
	panic("not used")
}

// BenchmarkCacheApply applies watch responses of 1, 10 and 100 updates to a
// cache of 20,000 and of 100,000 keys while a reader holds snapshots, including publishing
// the new snapshot and calling one handler. Values decode as plain strings,
// so the numbers are the cache's own cost.
func BenchmarkCacheApply(b *testing.B) {
	for _, keys := range []int{20_000, 100_000} {
		for _, batch := range []int{1, 10, 100} {
			benchApply(b, keys, batch)
		}
	}
	const keys = 20_000
	// For scale: what copying the whole map per event would cost.
	b.Run(fmt.Sprintf("keys=%d/naive-full-copy", keys), func(b *testing.B) {
		m := make(map[string]Item[string], keys)
		for i := range keys {
			k := fmt.Sprintf("/b/k%05d", i)
			m[k] = Item[string]{Key: k, Value: "v", ModRevision: 1}
		}
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			m = maps.Clone(m)
		}
	})
}

// benchApply is BenchmarkCacheApply for one cache size and batch size.
func benchApply(b *testing.B, keys, batch int) {
	b.Run(fmt.Sprintf("keys=%d/events=%d", keys, batch), func(b *testing.B) {
		c := New(noClient{}, "/b/", func(_ string, v []byte) (string, error) { return string(v), nil },
			Options{Logger: slog.New(slog.DiscardHandler)})
		c.AddHandler(func(Event[string]) {})
		ctx := context.Background()
		kvs := make([]*mvccpb.KeyValue, keys)
		for i := range kvs {
			kvs[i] = &mvccpb.KeyValue{Key: fmt.Appendf(nil, "/b/k%05d", i), Value: []byte("v"), CreateRevision: 1, ModRevision: 1, Version: 1}
		}
		c.applyList(ctx, 1, kvs)
		evs := make([]*clientv3.Event, batch)
		for i := range evs {
			evs[i] = &clientv3.Event{Type: clientv3.EventTypePut, Kv: &mvccpb.KeyValue{CreateRevision: 1, Value: []byte("w")}}
		}
		rev := int64(1)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			snap := c.Snapshot() // a reader keeps the old snapshot alive
			rev++
			for j, ev := range evs {
				ev.Kv.Key = kvs[(i*batch+j*7919)%keys].Key
				ev.Kv.ModRevision = rev
			}
			c.applyWatch(ctx, evs)
			_ = snap
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/event")
	})
}
