package lifecycle

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/state"
)

// amdahlHistory is a job's goodput reports at sizes by Amdahl's law with
// parallel fraction p, as its status would hold them.
func amdahlHistory(p, scale float64, sizes ...int) []state.GoodputSample {
	var out []state.GoodputSample
	for _, n := range sizes {
		out = append(out, state.GoodputSample{GoodputReport: state.GoodputReport{Size: n, SamplesPerSecond: scale / ((1 - p) + p/float64(n))},
			At: time.Now().UTC().Add(-time.Hour).Truncate(time.Second)})
	}
	return out
}

// TestGoodputSteersGrows, on the whole chain (agent, status merger, placer,
// controller): two elastic jobs hold 2 GPUs each beside a fixed job of 4;
// their statuses carry goodput reports at 2 and 4 GPUs, a's of a job that
// gains little from a third GPU, b's of one that scales. When the fixed job
// ends, VOYAGER_PLACER_GOODPUT on, b grows into the 4 idle GPUs and a is
// never resized; off, a (first by name) is grown first. b's reports survive
// its restart, and the report its new container writes at 6 GPUs joins
// them in its status.
func TestGoodputSteersGrows(t *testing.T) {
	for _, goodput := range []bool{true, false} {
		name := map[bool]string{true: "goodput", false: "size-blind"}[goodput]
		t.Run(name, func(t *testing.T) {
			c := newChain(t, ControllerConfig{ResizeInterval: time.Hour, Goodput: goodput},
				func(cfg *nodeagent.Config) { cfg.ActivityEvery = 50 * time.Millisecond })
			c.submit("fixed", 4, 0, false, func(s *state.Session) { s.Owner = "bob" })
			c.running("fixed")
			for id, p := range map[string]float64{"a": 0.5, "b": 0.99} {
				c.submit(id, 2, 0, false, func(s *state.Session) {
					s.Owner = "user-" + id
					// Size 2: bound at 2 whatever fair share allows.
					s.Elastic = &state.Elastic{Min: 2, Max: 8, Size: 2, Goodput: amdahlHistory(p, 300, 2, 4)}
				})
			}
			for _, id := range []string{"a", "b"} {
				if st := c.running(id); st.Elastic == nil || st.Elastic.Size != 2 || len(st.Elastic.Goodput) != 2 {
					t.Fatalf("%s running with %+v, want size 2 and its 2 reports", id, st.Elastic)
				}
			}
			c.finish("fixed", 0)
			grown, kept := "b", "a"
			if !goodput {
				grown, kept = "a", "b"
			}
			w, _ := waitKey(c.t, c.cli, keys.Warning(grown), grown+"'s resize warning", func(w state.Warning, found bool) bool { return found })
			if w.Reason != state.ReasonResized || w.Size != 6 {
				t.Fatalf("%s's warning %+v, want a grow to 6", grown, w)
			}
			st := c.status(grown, "running again at 6", func(st state.Status) bool {
				return st.Phase == state.PhaseRunning && st.Elastic != nil && st.Elastic.Size == 6
			})
			// The grown job's room is its own from its warning to its
			// next bind, even in a pass whose caches show its release but
			// not yet its eviction (warnResize compares the specs of jobs
			// between binds): the other job never grows into it.
			if warned(t, c.cli, kept) {
				t.Errorf("%s was warned too: the 4 idle GPUs went to %s", kept, grown)
			}
			if len(st.Elastic.Goodput) != 2 {
				t.Fatalf("%s's reports after its restart: %+v, want sizes 2 and 4 kept", grown, st.Elastic.Goodput)
			}
			if !goodput {
				return
			}
			// The job at 6 GPUs reports; it joins the sizes before.
			spec, ok := c.rt.Spec(c.container("b"))
			if !ok {
				t.Fatal("b has no container")
			}
			var dir string
			for _, m := range spec.Mounts {
				if m.Target == nodeagent.ReportsPath {
					dir = m.Source
				}
			}
			if dir == "" {
				t.Fatalf("b's container has no report directory: %+v", spec.Mounts)
			}
			rep, _ := json.Marshal(state.GoodputReport{Size: 6, SamplesPerSecond: 1700})
			if err := os.WriteFile(filepath.Join(dir, "goodput.json"), rep, 0o644); err != nil {
				t.Fatal(err)
			}
			st = c.status("b", "its report at 6 GPUs", func(st state.Status) bool { return st.Elastic != nil && len(st.Elastic.Goodput) == 3 })
			if g := st.Elastic.Goodput; g[0].Size != 2 || g[1].Size != 4 || g[2].Size != 6 || g[2].SamplesPerSecond != 1700 {
				t.Errorf("b's reports %+v, want sizes 2, 4 and 6 (1700 samples/s)", g)
			}
		})
	}
}
