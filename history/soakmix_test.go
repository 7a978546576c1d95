package history_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/voyager-gpu/voyager/state"
)

// revisionMix counts the soak's revisions by what they wrote: the
// directories (and the kind, put or delete) of their keys, so that the
// writes a bind costs can be read off a run (-soak.mix).
type revisionMix struct {
	mu     sync.Mutex
	shapes map[string]int64
	events map[string]int64
	total  int64
}

// follow watches every revision under k until ctx ends.
func (m *revisionMix) follow(ctx context.Context, cli *clientv3.Client, k state.Keys, from int64) {
	m.shapes, m.events = map[string]int64{}, map[string]int64{}
	dir := func(key string) string {
		rest := strings.TrimPrefix(key, k.All())
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			return rest[:i]
		}
		return rest
	}
	for ctx.Err() == nil {
		wch := cli.Watch(clientv3.WithRequireLeader(ctx), k.All(), clientv3.WithPrefix(), clientv3.WithRev(from))
		for resp := range wch {
			if resp.Err() != nil {
				break
			}
			var rev int64
			var parts []string
			flush := func() {
				if rev == 0 {
					return
				}
				sort.Strings(parts)
				m.mu.Lock()
				m.shapes[strings.Join(parts, " ")]++
				m.total++
				m.mu.Unlock()
				parts = parts[:0]
			}
			for _, ev := range resp.Events {
				if ev.Kv.ModRevision != rev {
					flush()
					rev = ev.Kv.ModRevision
				}
				op := "put"
				if ev.Type == mvccpb.DELETE {
					op = "del"
				}
				name := op + ":" + dir(string(ev.Kv.Key))
				parts = append(parts, name)
				m.mu.Lock()
				m.events[name]++
				m.mu.Unlock()
			}
			flush()
			from = rev + 1
		}
	}
}

// report lists the n most frequent revision shapes and events, per bind.
func (m *revisionMix) report(binds int64, n int) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "%d revisions, %.2f a bind; by what they wrote (a bind's share):\n", m.total, float64(m.total)/float64(max(binds, 1)))
	top := func(c map[string]int64) {
		keys := make([]string, 0, len(c))
		for s := range c {
			keys = append(keys, s)
		}
		sort.Slice(keys, func(i, j int) bool { return c[keys[i]] > c[keys[j]] })
		for i, s := range keys {
			if i == n {
				break
			}
			fmt.Fprintf(&b, "  %6.3f  %s\n", float64(c[s])/float64(max(binds, 1)), s)
		}
	}
	top(m.shapes)
	b.WriteString("events:\n")
	top(m.events)
	return b.String()
}

// callCounter counts the soak's etcd requests by component and method
// (-soak.calls); a transaction is a read when it writes nothing.
type callCounter struct {
	mu sync.Mutex
	n  map[string]int64
}

// interceptor counts who's unary calls.
func (c *callCounter) interceptor(who string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		name := method[strings.LastIndexByte(method, '/')+1:]
		dir := func(key []byte) string {
			f := strings.SplitN(string(key), "/", 4)
			if len(f) < 3 {
				return string(key)
			}
			return f[2]
		}
		switch r := req.(type) {
		case *etcdserverpb.RangeRequest:
			name += " " + dir(r.Key)
		case *etcdserverpb.TxnRequest:
			kind, dirs := "read", []string{}
			for _, ops := range [][]*etcdserverpb.RequestOp{r.Success, r.Failure} {
				for _, op := range ops {
					switch {
					case op.GetRequestRange() != nil:
						dirs = append(dirs, "get:"+dir(op.GetRequestRange().Key))
					case op.GetRequestPut() != nil:
						kind = "write"
						dirs = append(dirs, "put:"+dir(op.GetRequestPut().Key))
					case op.GetRequestDeleteRange() != nil:
						kind = "write"
						dirs = append(dirs, "del:"+dir(op.GetRequestDeleteRange().Key))
					}
				}
			}
			name += "(" + kind + ") " + strings.Join(slices.Compact(dirs), ",")
		}
		c.mu.Lock()
		if c.n == nil {
			c.n = map[string]int64{}
		}
		c.n[who+" "+name]++
		c.mu.Unlock()
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

func (c *callCounter) report(binds int64) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := make([]string, 0, len(c.n))
	var total int64
	for s, n := range c.n {
		keys = append(keys, s)
		total += n
	}
	sort.Slice(keys, func(i, j int) bool { return c.n[keys[i]] > c.n[keys[j]] })
	var b strings.Builder
	fmt.Fprintf(&b, "%.1f etcd requests a bind:\n", float64(total)/float64(max(binds, 1)))
	for _, s := range keys {
		fmt.Fprintf(&b, "  %6.2f  %s\n", float64(c.n[s])/float64(max(binds, 1)), s)
	}
	return b.String()
}
