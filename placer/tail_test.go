package placer

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// TestTailMatchesReference: the tail's path (tail.go), which answers a
// request whose shape failed earlier in the pass from facts gathered in
// one walk of the queue, changes no decision and no reason. Random
// snapshots (24 or 40 nodes, so that claims, the standing reserve and
// lending run too; running sessions with max runtimes or none; requests
// of 1 to 8 GPUs and fractions, some with max runtimes, some with Ray
// workers, some elastic, some with a node selector, of owners with run
// time records, aged so that they hold nodes; quotas on some rounds, a
// weight on others, teams on others), planned with binpack and spread,
// holds on and off, with the tail's path and with tailReference on: the
// plans (bindings, holds, every reason and position) are equal. Without
// its mayHold check tailWaits leaves aged requests waiting where place
// holds nodes for them, and this test fails.
func TestTailMatchesReference(t *testing.T) {
	t.Cleanup(func() { tailReference = false })
	rng := rand.New(rand.NewPCG(34, 7))
	owners := []string{"ada", "bob", "cy", "dee", "eve"}
	teams := []string{"a", "b"}
	tailed, held := 0, 0
	for round := 0; round < 40; round++ {
		nodes := 24
		if round%2 == 1 {
			nodes = 40
		}
		var views []NodeView
		for i := 0; i < nodes; i++ {
			v := view(gpuNode(fmt.Sprintf("n%02d", i), 8, "NVIDIA A100-SXM4-80GB"))
			for g := 0; g < 8; {
				k := []int{1, 2, 4, 8}[rng.IntN(4)]
				if g+k > 8 || rng.IntN(6) == 0 {
					break
				}
				id := fmt.Sprintf("r%02d-%d", i, g)
				v = teamRunning(v, id, owners[rng.IntN(len(owners))], teams[rng.IntN(2)], g, k)
				if rng.IntN(3) != 0 {
					a := v.Ledger.Allocations[id]
					a.Ends = t0.Add(time.Duration(1+rng.IntN(240)) * time.Minute)
					v.Ledger.Allocations[id] = a
				}
				g += k
			}
			views = append(views, v)
		}
		var pend []Pending
		for i := 0; i < 300; i++ {
			p := req(fmt.Sprintf("p%03d", i), owners[rng.IntN(len(owners))], []int{1, 1, 2, 4, 8}[rng.IntN(5)], time.Duration(rng.IntN(3600))*time.Second)
			e := p.Entry
			if rng.IntN(2) == 0 {
				e.MaxRuntime = state.Duration(time.Duration(10+rng.IntN(240)) * time.Minute)
			}
			if rng.IntN(4) == 0 {
				e.Priority = 1
			}
			switch rng.IntN(12) {
			case 0:
				e.Request.GPUs, e.Request.GPUShareMiB = 1, 20480 // a fraction
			case 1:
				e.Workers, e.WorkerRequest = 1+rng.IntN(2), &state.Resources{GPUs: 8, CPUMilli: 1000, MemoryMiB: 1024}
			case 2:
				e.Elastic = &state.Elastic{Min: 1, Max: 4}
				e.Request.GPUs = 4
			case 3:
				e.Request.NodeSelector = map[string]string{"zone": "a"}
			}
			pend = append(pend, p)
		}
		s := snap(views, pend...)
		s.Runtimes = backlogRuntimes()
		for _, o := range owners[:2] {
			rec := *s.Runtimes["user0"]
			rec.Owner = o
			s.Runtimes[o] = &rec
		}
		gpus, weight := int64(40), 3.0
		switch round % 4 {
		case 1:
			s.UserQuotas = map[string]state.Quota{"bob": {GPUs: &gpus}}
		case 2:
			s.UserQuotas = map[string]state.Quota{"ada": {Weight: &weight}}
		case 3:
			for i := range s.Pending {
				s.Pending[i].Entry.Team = teams[i%2]
			}
			s.Teams = state.NewTeamTree(team("a", "", 64, 1), team("b", "", 32, 3))
		}
		for _, opt := range []PlanOptions{
			{ReserveAfter: 10 * time.Minute},
			{ReserveAfter: 10 * time.Minute, Strategy: Spread},
			{},
			{ReserveAfter: 3 * time.Minute, ShortFirst: true},
		} {
			tailReference = true
			want := NewPlan(s, opt)
			tailReference = false
			got := NewPlan(s, opt)
			tailed += got.tailed
			got.tailed = 0
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("round %d, %+v: the tail's plan differs from the reference's:\n got %+v\nwant %+v", round, opt, got, want)
			}
			if len(want.Reserved) > 0 {
				held++
			}
		}
	}
	if held < 40 || tailed < 1000 {
		t.Fatalf("%d of 160 plans held a node and %d requests took the tail's path: the path went untested", held, tailed)
	}
}

// TestTailNotesLenders: a request answered on the tail's path is noted
// for lending as place notes it. On 24 nodes, hog (above its share) and
// low (below it) full but for one GPU, the standing reserve off (so that
// both owners' requests are of one shape); hog's young 8-GPU request at a
// higher priority fails first and is noted by no one (its owner is at
// its share), low's of the same shape then waits on the tail's path, and
// that wait keeps back hog's 1-GPU request with no max runtime (lend.go),
// in both plans alike.
func TestTailNotesLenders(t *testing.T) {
	t.Cleanup(func() { tailReference = false })
	nodes := wholeNodes(20, "hog", 3, "low")
	nodes = append(nodes, holding(view(gpuNode("n23", 8, "A100")), "h23", "hog", 7))
	h1 := req("h1", "hog", 8, 0)
	h1.Entry.Priority = 1
	s := snap(nodes, h1, req("l1", "low", 8, 0), req("h2", "hog", 1, 0))
	opt := PlanOptions{ReserveAfter: 10 * time.Minute, Without: RuleReserve}
	tailReference = true
	want := NewPlan(s, opt)
	tailReference = false
	got := NewPlan(s, opt)
	if got.tailed != 1 {
		t.Fatalf("the tail's path answered %d requests, want 1 (low's)", got.tailed)
	}
	got.tailed = 0
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the tail's plan differs from the reference's:\n got %+v\nwant %+v", got, want)
	}
	if len(got.Bound) != 0 || len(got.Waiting) != 3 || !strings.Contains(got.Waiting[2].Message, "low's request for 8") {
		t.Fatalf("bound %d, waiting %+v: want hog's 1-GPU request kept back by low's", len(got.Bound), got.Waiting)
	}
}
