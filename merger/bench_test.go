package merger_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/benchsum"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/merger"
	"github.com/voyager-gpu/voyager/state"
)

// BenchmarkMergeHop measures what the status merger adds between an
// agent's report and the status a user reads, on Debian's etcd in its own
// process, one session at a time:
//
//   - start: from the agent's Running part write to the Running status on
//     a watch; its ceiling is what the agent did before part keys, in the
//     same run: read the status and write it Running in one conditional
//     transaction, until the watch shows it.
//   - end: from the release (ledger, binding and the part's end in one
//     transaction, state.Release) to the final status on the watch; its
//     ceiling is the same release until the watch shows its binding
//     deleted, which is when the old release's status (written in that
//     very transaction) was visible.
//
// Each of b.N takes hopSamples samples of both. Metrics: start-p50-ms,
// start-p99-ms, end-p50-ms, end-p99-ms, the ceilings' (direct-…), and the
// ratios start-x-direct-p50 and end-x-direct-p50.
func BenchmarkMergeHop(b *testing.B) {
	cli := etcdtest.StartExternal(b).Client(b)
	ctx, cancel := context.WithCancel(context.Background())
	// Without the settle time (Config.Settle), which adds its 100 ms by
	// design: the hop itself.
	m := merger.New(cli, merger.Config{Keys: keys, Settle: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()
	wch := cli.Watch(ctx, keys.All(), clientv3.WithPrefix())
	// seen waits until the watch shows key with a value that ok accepts
	// (nil value: deleted).
	seen := func(key string, ok func(v []byte) bool) {
		deadline := time.After(30 * time.Second)
		for {
			select {
			case wr := <-wch:
				for _, ev := range wr.Events {
					if string(ev.Kv.Key) != key {
						continue
					}
					var v []byte
					if ev.Type == clientv3.EventTypePut {
						v = ev.Kv.Value
					}
					if ok(v) {
						return
					}
				}
			case <-deadline:
				b.Fatalf("the watch never showed %s as wanted", key)
			}
		}
	}
	phaseIs := func(ph state.Phase) func([]byte) bool {
		return func(v []byte) bool {
			st, err := state.Decode[state.Status](v)
			return v != nil && err == nil && st.Phase == ph
		}
	}
	var start, direct, end, directEnd []time.Duration
	b.ResetTimer()
	// Each of b.N takes hopSamples samples of every figure, so a run's
	// p99 rests on a thousand samples and one run (b.N = 1 already takes
	// longer than the default benchtime) gives one row of the summary:
	// with b.N alone, Go's rounds of 1, 40, 100… samples each added rows
	// of their own, a p99 of one sample among them.
	for i := range b.N * hopSamples {
		// Through the merger.
		id := fmt.Sprintf("skm%d", i)
		bd := bound(b, cli, state.Session{ID: id, Owner: "ada", Kind: state.KindBatch}, "n1")["n1"]
		t0 := time.Now()
		report(b, cli, bd, func(p *state.PartStatus) {
			now := time.Now().UTC()
			p.Phase, p.Started = state.PhaseRunning, &now
		})
		seen(keys.Status(id), phaseIs(state.PhaseRunning))
		start = append(start, time.Since(t0))
		t0 = time.Now()
		release(b, cli, bd, state.PhaseSucceeded, 0)
		seen(keys.Status(id), phaseIs(state.PhaseSucceeded))
		end = append(end, time.Since(t0))

		// Directly, as agents wrote statuses before part keys.
		id = fmt.Sprintf("skd%d", i)
		bd = bound(b, cli, state.Session{ID: id, Owner: "ada", Kind: state.KindBatch}, "n1")["n1"]
		brev := bindingRev(b, cli, bd)
		t0 = time.Now()
		st, rev, err := state.Get[state.Status](ctx, cli, keys.Status(id))
		if err != nil {
			b.Fatal(err)
		}
		now := time.Now().UTC()
		st.Phase, st.Started, st.Updated = state.PhaseRunning, &now, now
		v, err := state.Encode(st)
		if err != nil {
			b.Fatal(err)
		}
		r, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(keys.Binding("n1", id)), "=", brev),
			clientv3.Compare(clientv3.ModRevision(keys.Status(id)), "=", rev)).Then(clientv3.OpPut(keys.Status(id), v)).Commit()
		if err != nil || !r.Succeeded {
			b.Fatalf("direct status write: %v", err)
		}
		seen(keys.Status(id), phaseIs(state.PhaseRunning))
		direct = append(direct, time.Since(t0))
		t0 = time.Now()
		if err := state.Release(ctx, cli, keys, "n1", id, brev, nil); err != nil {
			b.Fatal(err)
		}
		seen(keys.Binding("n1", id), func(v []byte) bool { return v == nil })
		directEnd = append(directEnd, time.Since(t0))
	}
	b.StopTimer()
	for _, f := range []struct {
		name        string
		lat, ceil   []time.Duration
		figure, cap string
	}{
		{"start", start, direct, "agent's Running report → Running status (through the merger)", "direct status write, same run"},
		{"end", end, directEnd, "agent's release → final status (through the merger)", "release alone (the old status in its txn), same run"},
	} {
		b.ReportMetric(benchsum.QuantileMS(f.lat, 0.50), f.name+"-p50-ms")
		b.ReportMetric(benchsum.QuantileMS(f.lat, 0.99), f.name+"-p99-ms")
		b.ReportMetric(benchsum.QuantileMS(f.ceil, 0.50), "direct-"+f.name+"-p50-ms")
		b.ReportMetric(benchsum.QuantileMS(f.ceil, 0.99), "direct-"+f.name+"-p99-ms")
		b.ReportMetric(benchsum.QuantileMS(f.lat, 0.50)/benchsum.QuantileMS(f.ceil, 0.50), f.name+"-x-direct-p50")
		for _, q := range []float64{0.50, 0.99} {
			benchsum.Add(b, benchsum.Row{Figure: fmt.Sprintf("%s p%.0f (%d samples)", f.figure, q*100, len(f.lat)),
				Value: benchsum.QuantileMS(f.lat, q), Unit: "ms", Ceiling: benchsum.QuantileMS(f.ceil, q), CeilingName: f.cap})
		}
	}
}

// hopSamples is how many samples of each figure one of BenchmarkMergeHop's
// b.N takes.
const hopSamples = 1000
