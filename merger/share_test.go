package merger_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/merger"
	"github.com/voyager-gpu/voyager/state"
)

// TestMergersShareTheSessions: three mergers of three live placers
// (placers/<id>) merge each part's change once between them, not three
// times (with a resync far beyond the test, only a change's own merge
// counts); when one placer's key goes (it died) and its merger with it,
// the others merge its share at once, without waiting for their resync.
func TestMergersShareTheSessions(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	ids := []string{"pa", "pb", "pc"}
	for _, id := range ids {
		if _, err := state.Put(ctx, cli, keys.Placer(id), state.Placer{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ms := map[string]*merger.Merger{}
	stops := map[string]func(){}
	for _, id := range ids {
		m := merger.New(cli, merger.Config{Keys: keys, Logger: quiet, Resync: time.Hour, Member: id})
		mctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- m.Run(mctx) }()
		stopped := false
		stop := func() {
			if stopped {
				return
			}
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("merger %s: %v", id, err)
			}
		}
		ms[id], stops[id] = m, stop
		t.Cleanup(stop)
	}
	const n = 30
	var bs []state.Binding
	for i := range n {
		bs = append(bs, bound(t, cli, state.Session{ID: fmt.Sprintf("sh%02d", i), Owner: "ada", Kind: state.KindBatch}, "n1")["n1"])
	}
	merges := func() int64 { return ms["pa"].Merges() + ms["pb"].Merges() + ms["pc"].Merges() }
	probes := 0
	waitFor(t, "three placers in every merger's share", func() (bool, string) {
		// A part written now is merged by exactly one merger once
		// the shares are settled; probe with the first session until
		// so. Each probe is counted once its own merge is in the
		// status: a probe's merge that landed after the count (it was
		// counted as the main phase's, 30 merges of 29 changes, about
		// one run in a hundred under the race detector) is what a
		// fixed wait here let through.
		probes++
		reason := fmt.Sprint("probe", probes)
		before := merges()
		report(t, cli, bs[0], func(p *state.PartStatus) { p.Phase, p.Reason = state.PhaseStarting, reason })
		for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			st, _, err := state.Get[state.Status](ctx, cli, keys.Status(bs[0].Session))
			if err == nil && st.Reason == reason {
				break
			}
			if time.Now().After(deadline) { // no merger took it yet: probe again
				return false, "probe " + reason + " not merged within 2 s"
			}
		}
		after := merges()
		return after-before == 1, fmt.Sprintf("%d merges of one change", after-before)
	})
	before := map[string]int64{}
	for _, id := range ids {
		before[id] = ms[id].Merges()
	}
	for _, b := range bs[1:] {
		report(t, cli, b, func(p *state.PartStatus) { p.Phase, p.Reason = state.PhaseStarting, "Launching" })
	}
	for _, b := range bs[1:] {
		waitPhase(t, cli, b.Session, state.PhaseStarting)
	}
	total := int64(0)
	for _, id := range ids {
		d := ms[id].Merges() - before[id]
		total += d
		if d == 0 || d == n-1 {
			t.Errorf("merger %s merged %d of %d changes; want a share, not none or all", id, d, n-1)
		}
	}
	if total != n-1 {
		t.Errorf("%d merges of %d changes; want each merged once", total, n-1)
	}
	// pb dies: its merger stops; the parts move on; its key goes only
	// later (its lease expires). Until then pb's share waits; then the
	// others merge it at once, though their resync is an hour away.
	stops["pb"]()
	for _, b := range bs[1:] {
		report(t, cli, b, func(p *state.PartStatus) {
			now := time.Now().UTC()
			p.Phase, p.Started = state.PhaseRunning, &now
		})
	}
	running := func() (int, int) {
		up, waiting := 0, 0
		for _, b := range bs[1:] {
			if st, _, err := state.Get[state.Status](ctx, cli, keys.Status(b.Session)); err == nil && st.Phase == state.PhaseRunning {
				up++
			} else {
				waiting++
			}
		}
		return up, waiting
	}
	waitFor(t, "the live mergers' shares Running", func() (bool, string) {
		up, _ := running()
		return up == int(total-(ms["pb"].Merges()-before["pb"])), fmt.Sprint(up, " running")
	})
	if _, waiting := running(); waiting == 0 {
		t.Fatalf("every session Running while pb's key lives; want pb's share waiting")
	}
	if _, err := cli.Delete(ctx, keys.Placer("pb")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pb's share merged by the others", func() (bool, string) {
		up, waiting := running()
		return waiting == 0, fmt.Sprint(up, " running, ", waiting, " not")
	})
}
