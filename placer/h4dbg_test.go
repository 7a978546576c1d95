package placer

import (
	"fmt"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

func TestH4Entitle(t *testing.T) {
	var nodes []NodeView
	for i := 0; i < 16; i++ {
		nodes = append(nodes, view(gpuNode(fmt.Sprintf("n%02d", i), 8, "A100")))
	}
	var pend []Pending
	for i := 0; i < 100; i++ {
		for _, u := range []string{"u1", "u2", "u3"} {
			pend = append(pend, teamReq(fmt.Sprintf("%s-%03d", u, i), u, "t"+u[1:], 1+i%8, time.Duration(i)*time.Second))
		}
	}
	s := snap(nodes, pend...)
	s.Teams = state.NewTeamTree(team("t1", "", 0, 1), team("t2", "", 0, 2), team("t3", "", 0, 3))
	p, _ := newPlan(s, PlanOptions{}, nil)
	t.Log(boundBy(p))
	pl := &planner{snap: s}
	pl.nodes = nil
	for i := range s.Nodes {
		pl.nodes = append(pl.nodes, newNodeState(&s.Nodes[i]))
	}
	pl.usage = newUsage(pl.nodes, nil)
	pl.quota = &pl.usage
	pl.teams = newTeamPlan(s, pl.nodes, pl.usage.total)
	t.Log(pl.teams.entitle(pl.usage.total.gpus, s.Pending, 0, pl.ownerWeight))
}
