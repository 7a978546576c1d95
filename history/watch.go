package history

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
)

// Options say which revisions Watch checks.
type Options struct {
	// Start is the revision whose keyspace the model is loaded from; the
	// check applies every revision after it. 0: the current revision.
	// Revisions at or before Start may be compacted; Start itself must
	// not be.
	Start int64
	// End, when not 0, ends the check once every revision up to End is
	// applied. 0 follows the cluster until ctx ends.
	End int64
	// OnViolation, when set, is called with each violation as found.
	OnViolation func(Violation)
	// OnRevision, when set, is called after each applied revision (and
	// after each progress notification) with the binds counted so far:
	// everything up to rev is checked, so history up to rev may be
	// compacted.
	OnRevision func(rev, binds int64)
	// Keep bounds how many violations Result keeps (default 1000); the
	// count is always exact.
	Keep int
	// StuckAfter is the bound of the no-progress and left-behind rules,
	// by the history's own clock (Checker.SetStuckAfter). 0:
	// DefaultStuckAfter.
	StuckAfter time.Duration
}

// Result is what a check saw.
type Result struct {
	Start, Last int64 // the loaded revision and the last applied one
	Revisions   int64 // revisions applied
	Binds       int64 // binds applied: statuses that became Bound
	Violations  []Violation
	Count       int // violations found (Violations keeps the first Keep)
}

// ErrCompacted means the start revision is no longer in etcd's history.
var ErrCompacted = errors.New("history compacted")

// Watch checks the history of the keyspace under k from opts.Start,
// read-only: it lists the model's keys at Start, then watches every later
// revision, and applies each whole revision to a Checker. It asks for no
// previous values (WithPrevKV costs etcd a read an event): the gap and
// accrual rules read the keys' versions instead. It returns when
// opts.End is reached, or ctx ends (nil error then: following stops), or
// the watch fails.
func Watch(ctx context.Context, cli *clientv3.Client, k state.Keys, opts Options) (Result, error) {
	if opts.Keep == 0 {
		opts.Keep = 1000
	}
	res := Result{}
	report := func(vs []Violation) {
		for _, v := range vs {
			res.Count++
			if len(res.Violations) < opts.Keep {
				res.Violations = append(res.Violations, v)
			}
			if opts.OnViolation != nil {
				opts.OnViolation(v)
			}
		}
	}
	start := opts.Start
	if start == 0 {
		r, err := cli.Get(ctx, k.All(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return res, fmt.Errorf("read current revision: %w", err)
		}
		start = r.Header.Revision
	}
	c := New(k)
	if opts.StuckAfter > 0 {
		c.SetStuckAfter(opts.StuckAfter)
	}
	var initial []Change
	for _, dir := range []string{k.Arrays(), k.Sessions(), k.Nodes(), k.Ledgers(), k.AllBindings(), k.PendingDir(), k.StatusDir(), k.Parts(), k.Teams()} {
		r, err := cli.Get(ctx, dir, clientv3.WithPrefix(), clientv3.WithRev(start))
		if err != nil {
			if errors.Is(err, rpctypes.ErrCompacted) {
				return res, fmt.Errorf("load revision %d: %w", start, ErrCompacted)
			}
			return res, fmt.Errorf("load revision %d: %w", start, err)
		}
		for _, kv := range r.Kvs {
			initial = append(initial, Change{Key: string(kv.Key), Value: kv.Value, Version: kv.Version})
		}
	}
	res.Start, res.Last = start, start
	report(c.Load(start, initial))
	if opts.End != 0 && opts.End <= start {
		return res, nil
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	watch := func(from int64) clientv3.WatchChan {
		return cli.Watch(wctx, k.All(), clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithProgressNotify())
	}
	wch := watch(start + 1)
	if opts.End != 0 {
		// Progress notifications tell a range check that nothing more
		// came up to End.
		go func() {
			t := time.NewTicker(200 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-wctx.Done():
					return
				case <-t.C:
					_ = cli.RequestProgress(wctx)
				}
			}
		}()
	}
	var group []Change
	groupRev := int64(0)
	flush := func() {
		if groupRev == 0 {
			return
		}
		report(c.Apply(groupRev, group))
		res.Revisions++
		res.Binds = c.Binds()
		res.Last = groupRev
		if opts.OnRevision != nil {
			opts.OnRevision(groupRev, c.Binds())
		}
		group, groupRev = group[:0], 0
	}
	// A watch that fails (its member lost the leader, or died) is taken
	// up again after the last revision applied: etcd never splits a
	// revision's events across responses, and each response is applied
	// whole, so nothing is missed or applied twice.
	failures := 0
	for {
		resp, ok := <-wch
		if !ok {
			if ctx.Err() != nil {
				return res, nil
			}
			if failures++; failures > 60 {
				return res, fmt.Errorf("watch history: the watch ended")
			}
			time.Sleep(100 * time.Millisecond)
			wch = watch(res.Last + 1)
			continue
		}
		if resp.CompactRevision != 0 {
			return res, fmt.Errorf("watch from revision %d: compacted up to %d: %w", res.Last+1, resp.CompactRevision, ErrCompacted)
		}
		if err := resp.Err(); err != nil {
			if errors.Is(err, rpctypes.ErrNoLeader) || errors.Is(err, rpctypes.ErrGRPCNoLeader) {
				continue // the channel closes next; watched again from there
			}
			return res, fmt.Errorf("watch history: %w", err)
		}
		failures = 0
		for _, ev := range resp.Events {
			if opts.End != 0 && ev.Kv.ModRevision > opts.End {
				flush()
				return res, nil
			}
			if ev.Kv.ModRevision != groupRev {
				flush()
				groupRev = ev.Kv.ModRevision
			}
			ch := Change{Key: string(ev.Kv.Key)}
			if ev.Type == mvccpb.PUT {
				ch.Value, ch.Version = ev.Kv.Value, ev.Kv.Version
			}
			group = append(group, ch)
		}
		// etcd never splits one revision's events across responses.
		flush()
		// Only a progress notification promises that every event up to
		// its header's revision was sent.
		if resp.IsProgressNotify() {
			if resp.Header.Revision > res.Last {
				res.Last = resp.Header.Revision
				if opts.OnRevision != nil {
					opts.OnRevision(res.Last, c.Binds())
				}
			}
		}
		if opts.End != 0 && res.Last >= opts.End {
			return res, nil
		}
	}
}
