package placer

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// TestModelScanMatchesReference: what modelmatch.go makes fast (the memo
// of model pattern matches, the matcher's last model, and the node scans
// of closest and explain skipping nodes with no more free GPUs than the
// best so far), the memo of team notes (teamnotes.go), and the searches
// for fractions and MIG devices reading only the nodes that have them
// (nodesOf, lacksKind, gpusFit), change no decision and no reason. Random
// snapshots (nodes of two models and of both, unhealthy GPUs, shared GPUs,
// GPUs split into MIG devices, cordons, running sessions of four teams
// with max runtimes or none; requests of whole GPUs, fractions or MIG
// devices, of any model or a pattern, a malformed one among them, with a
// memory floor or none, aged so that they hold nodes), planned with
// teams by count, by model, and with none, each with the fast path and
// with modelScanReference on: the plans (bindings, holds, every reason)
// are equal. It also caught the queue order depending on a map's order
// where one owner queued in two teams with requests of one age
// (ownerHeap.Less: round 50 failed about one run in five).
func TestModelScanMatchesReference(t *testing.T) {
	t.Cleanup(func() { modelScanReference = false })
	rng := rand.New(rand.NewPCG(3436, 9))
	teams := []string{"a1", "a2", "b", "c"}
	models := []string{"NVIDIA A100-SXM4-80GB", h100}
	patterns := []string{"", "", "*H100*", "*A100*", "NVIDIA H100*", "*80GB*", "[", "*V100*"}
	held := 0
	for round := 0; round < 60; round++ {
		var nodes []NodeView
		for i := 0; i < 24; i++ {
			n := gpuNode(fmt.Sprintf("n%02d", i), 8, models[rng.IntN(2)])
			shared, mig := rng.IntN(8) == 0, rng.IntN(8) == 0
			for j := range n.GPUs {
				if rng.IntN(6) == 0 {
					n.GPUs[j].Model = models[rng.IntN(2)] // nodes of both models
				}
				n.GPUs[j].Healthy = rng.IntN(15) != 0
				n.GPUs[j].Shared = shared
			}
			if mig && !shared {
				for j := range n.GPUs {
					if rng.IntN(3) != 0 {
						n = split(n, j) // two 1g.10gb devices
					}
				}
			}
			v := view(n)
			if rng.IntN(12) == 0 {
				v.Cordon = &state.Cordon{Node: n.Name}
			}
			if !shared && !mig {
				for g := 0; g < 8; {
					k := 1 + rng.IntN(4)
					if g+k > 8 || rng.IntN(4) == 0 {
						break
					}
					id := fmt.Sprintf("r%02d-%d", i, g)
					v = teamRunning(v, id, fmt.Sprintf("u%d", rng.IntN(6)), teams[rng.IntN(len(teams))], g, k)
					if rng.IntN(2) == 0 {
						a := v.Ledger.Allocations[id]
						a.Ends = t0.Add(time.Duration(1+rng.IntN(240)) * time.Minute)
						v.Ledger.Allocations[id] = a
					}
					g += k
				}
			}
			nodes = append(nodes, v)
		}
		var pend []Pending
		for i := 0; i < 150; i++ {
			p := teamReq(fmt.Sprintf("p%03d", i), fmt.Sprintf("u%d", rng.IntN(6)), teams[rng.IntN(len(teams))],
				[]int{1, 1, 2, 4, 8}[rng.IntN(5)], time.Duration(rng.IntN(7200))*time.Second)
			r := &p.Entry.Request
			r.GPUModel = patterns[rng.IntN(len(patterns))]
			switch rng.IntN(8) {
			case 0:
				r.GPUs, r.GPUShareMiB = 1, 20480 // a fraction
			case 1:
				r.GPUMemoryMiB = 81920
			case 2:
				r.GPUs, r.MIGProfile = 1+rng.IntN(3), "1g.10gb"
			}
			if rng.IntN(2) == 0 {
				p.Entry.MaxRuntime = state.Duration(time.Duration(1+rng.IntN(120)) * time.Minute)
			}
			pend = append(pend, p)
		}
		s := snap(nodes, pend...)
		switch round % 3 {
		case 0:
			s.Teams = state.NewTeamTree(team("a", "", 64, 1), team("a1", "a", 32, 2), team("a2", "a", 0, 1), team("b", "", 32, 3), withMax(team("c", "", 0, 1), 48))
		case 1:
			s.Teams = state.NewTeamTree(team("a", "", 64, 1), withModels(team("a1", "a", 32, 2), map[string]int{"H100": 16}), team("a2", "a", 0, 1),
				withModels(team("b", "", 32, 3), map[string]int{"A100": 16, "H100": 8}), withMax(team("c", "", 0, 1), 48))
		}
		opt := PlanOptions{ReserveAfter: 10 * time.Minute}
		modelScanReference = true
		want := NewPlan(s, opt)
		modelScanReference = false
		got := NewPlan(s, opt)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d: the fast scans' plan differs from the reference's:\n got %+v\nwant %+v", round, got, want)
		}
		if len(want.Reserved) > 0 {
			held++
		}
	}
	if held < 10 {
		t.Fatalf("only %d of 60 rounds held a node: the holds' scans went untested", held)
	}
}
