package sim

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestBurstRecovers runs the two burst shapes at 200 nodes, seeds 1-3
// (seed 1 under the race detector). adv-burst-8: a script submitting 20
// 8-GPU runs at once into a cluster the two steady users keep full.
// adv-burst-1: one submitting 400 1-GPU runs at once beside a user
// asking only for 8-GPU sessions; as the sweep's runs end one by one
// they leave free GPUs scattered over the nodes, and the 8-GPU requests
// wait for whole ones. No policy that stops no session can give a sweep
// more than the GPUs free at the pass it arrives, so Jain's index falls
// below the goal there (placer/README.md, "Goals not reached"). What the
// holds must do is start 8-GPU requests as soon as nodes can drain: the
// p99 wait of 8-GPU requests must be at most 10 minutes (five passes)
// beyond the longest drain by true run times that any pass saw for the
// 8-GPU requests it left waiting (Pass.Drains: the k-th soonest node to
// empty for k requests, if nothing else were placed and every run time
// were known). adv-burst-8, seeds 1-3: 49, 28 and 32 min against drains
// of 52, 25 and 28; with the holds and the standing reserve off
// (ReserveAfter 0) 124, 51 and 81 against 99, 40 and 53, and the test
// fails. adv-burst-1: 101, 104 and 89 min against 149, 212 and 132. It
// also asserts that every run of passes below the Jain goal ends within
// 30 minutes (adv-burst-8 10-14 measured, adv-burst-1 6-8), that the index is at
// least 0.95 on average, and that each pass's Drains are ascending, one
// a node, and zero for every node with 8 GPUs free.
func TestBurstRecovers(t *testing.T) {
	seeds := []uint64{1, 2, 3}
	if raceEnabled {
		seeds = seeds[:1]
	}
	for _, name := range []string{"adv-burst-8", "adv-burst-1"} {
		shape := suiteByName(200)[name]
		for _, seed := range seeds {
			t.Run(name+"/"+string(rune('0'+seed)), func(t *testing.T) {
				t.Parallel()
				cfg := shape.Build(defaultOptions(t), seed)
				var (
					longest, run time.Duration
					drain        time.Duration
					last         time.Duration = -1
					bad          string
				)
				cfg.Trace = func(p Pass) {
					if len(p.Drains) != cfg.Nodes || !slices.IsSorted(p.Drains) || p.Slots8 > 0 && p.Drains[p.Slots8-1] != 0 {
						bad = "drains not ascending, not one a node, or not zero on the nodes with 8 GPUs free"
					}
					k := 0
					for _, w := range p.Plan.Waiting {
						if w.Pending.Entry.Request.GPUs == 8 {
							k++
						}
					}
					if k > 0 && k <= len(p.Drains) {
						drain = max(drain, p.Drains[k-1])
					}
					if p.Jain >= IssueGoals.JainMin {
						return
					}
					if p.Now-last == cfg.Tick {
						run += cfg.Tick
					} else {
						run = cfg.Tick
					}
					last, longest = p.Now, max(longest, run)
				}
				r := Run(cfg)
				t.Logf("seed %d: Jain least %.3f, mean %.3f; longest run of passes below %.2f: %v; p99 8/1 %.2f, 8-GPU p99 %.0f min, longest drain by true run times %v", seed, r.JainMin, r.Jain, IssueGoals.JainMin, longest, r.Ratio(), r.Wait["8"].P99, drain.Round(time.Second))
				if bad != "" {
					t.Error(bad)
				}
				if p99 := time.Duration(r.Wait["8"].P99 * float64(time.Minute)); p99 > drain+5*cfg.Tick {
					t.Errorf("p99 wait of 8-GPU requests %v, more than five passes beyond the longest drain by true run times (%v)", p99.Round(time.Second), drain.Round(time.Second))
				}
				if longest > 30*time.Minute {
					t.Errorf("Jain's index below %.2f for %v in a row, want at most 30m", IssueGoals.JainMin, longest)
				}
				if r.Jain < IssueGoals.JainMin {
					t.Errorf("Jain's index on average %.3f, goal %.2f", r.Jain, IssueGoals.JainMin)
				}
			})
		}
	}
}

// TestPassDrainsAreTrueRunTimesLeft: bursts of three 8-GPU runs of
// exactly 30 minutes on two nodes. While one waits, both nodes run runs
// that started together, so each pass's Drains are equal, in (0, 30m],
// and a pass (one minute) shorter than the pass before's while the same
// runs go on.
func TestPassDrainsAreTrueRunTimesLeft(t *testing.T) {
	fixed := Runtime{Kind: Fixed, Mean: 30 * time.Minute}
	cfg := Config{Nodes: 2, Plan: defaultOptions(t), Streams: []Stream{Bursts("b", 4*time.Hour, 3, Size{GPUs: 8}, fixed)},
		Duration: 12 * time.Hour, Tick: time.Minute, Seed: 3}
	var (
		passes int
		prev   Pass
		bad    []string
	)
	cfg.Trace = func(p Pass) {
		if len(p.Drains) != 2 {
			bad = append(bad, fmt.Sprintf("%v: %d drains, want 2", p.Now, len(p.Drains)))
			return
		}
		if p.Drains[0] != p.Drains[1] || p.Drains[0] <= 0 || p.Drains[0] > fixed.Mean {
			bad = append(bad, fmt.Sprintf("%v: drains %v, want two equal, in (0, 30m]", p.Now, p.Drains))
		}
		// A pass after another, both runs going on: a pass less. (When
		// the pair ended at this pass, the next ones started in it.)
		if passes > 0 && p.Now-prev.Now == cfg.Tick && prev.Drains[0] > cfg.Tick && prev.Drains[0]-p.Drains[0] != cfg.Tick {
			bad = append(bad, fmt.Sprintf("%v: drains %v a pass after %v", p.Now, p.Drains, prev.Drains))
		}
		passes++
		prev = p
	}
	Run(cfg)
	if passes == 0 {
		t.Fatal("no pass left the third run waiting")
	}
	for _, b := range bad {
		t.Error(b)
	}
	t.Logf("%d passes with a run waiting", passes)
}
