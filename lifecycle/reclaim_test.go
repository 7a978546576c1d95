package lifecycle

import (
	"context"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/voyager-gpu/voyager/state"
)

// TestReclaimBorrowedGPUsForATeam runs the placer, the lifecycle
// controller and an agent on one 8-GPU node: team nlp (guarantee 2)
// borrows all 8 GPUs with preemptible jobs of priority 10; team vision
// (guarantee 6) then asks for 4 GPUs at priority 0, which no priority
// preemption allows. The controller reclaims: it warns exactly the nlp
// job whose stop gives vision its 4 GPUs, its warning naming the team and
// by how much nlp was over its guarantee; the job stops after its grace
// and is queued again, and vision's job runs. nlp's other jobs, within
// what it keeps (4 GPUs, 2 of them its guarantee), keep running. Without
// teams/ the controller preempts nothing (TestPreemptionPicksFewestVictims
// needs a higher priority).
func TestReclaimBorrowedGPUsForATeam(t *testing.T) {
	c := newChain(t, ControllerConfig{PreemptGrace: 300 * time.Millisecond})
	ctx := context.Background()
	for _, tm := range []state.Team{{Name: "vision", Guarantee: state.TeamGuarantee{GPUs: 6}}, {Name: "nlp", Guarantee: state.TeamGuarantee{GPUs: 2}}} {
		tr, err := state.ReadTeams(ctx, c.cli, keys)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := state.PutTeam(ctx, c.cli, keys, tr, tm); err != nil {
			t.Fatal(err)
		}
	}
	inTeam := func(team string) func(*state.Session) { return func(s *state.Session) { s.Team = team } }
	c.submit("nlp-a", 4, 10, true, inTeam("nlp"))
	c.submit("nlp-b", 2, 10, true, inTeam("nlp"))
	c.submit("nlp-c", 2, 10, true, inTeam("nlp"))
	for _, id := range []string{"nlp-a", "nlp-b", "nlp-c"} {
		c.running(id)
	}
	c.submit("vision-1", 4, 0, false, inTeam("vision"))
	// Its reason names the borrower while it waits.
	c.status("vision-1", "waiting on the borrower", func(st state.Status) bool {
		return st.Phase == state.PhasePending && strings.Contains(st.Message, "borrowed by team nlp")
	})
	w, _ := waitKey(t, c.cli, keys.Warning("nlp-a"), "nlp-a's reclaim warning", func(w state.Warning, found bool) bool { return found })
	if w.Reason != state.ReasonPreempted || w.By != "vision-1" ||
		!strings.Contains(w.Message, "team vision reclaims its guarantee") || !strings.Contains(w.Message, "your team nlp holds 8 GPUs, 6 over its guarantee of 2") {
		t.Fatalf("warning %+v, want nlp-a preempted for vision-1 with the team's reason", w)
	}
	vis := c.running("vision-1")
	if vis.Started == nil || vis.Started.Before(w.StopAt) {
		t.Fatalf("vision-1 started at %v, before nlp-a's grace ended at %s", vis.Started, w.StopAt)
	}
	c.status("nlp-a", "re-queued", func(st state.Status) bool { return st.Phase == state.PhasePending && st.RetryAt == nil })
	// The warning names the reclaiming team; the stop (its eviction
	// message, while it stops) says it was a reclaim, and counts in the
	// team's preemptions by reason.
	if w.Reclaim != "vision" {
		t.Errorf("warning's reclaim %q, want vision", w.Reclaim)
	}
	if m := preemptedMessage(w); m != "preempted by vision-1: team vision reclaims its guarantee" {
		t.Errorf("nlp-a's eviction message %q, want it to say team vision reclaims its guarantee", m)
	}
	if n := counted(t, c.ctl, "nlp", "vision", "reclaim"); n != 1 {
		t.Errorf("voyager_lifecycle_team_preemptions_total{team=nlp,by_team=vision,reason=reclaim} = %v, want 1", n)
	}
	for _, id := range []string{"nlp-b", "nlp-c"} {
		if warned(t, c.cli, id) {
			t.Errorf("%s was warned; one victim gave vision its 4 GPUs", id)
		}
	}
	// nlp-a waits: vision (4 of its 6) is ahead of nlp (4 held, over its 2).
	c.status("nlp-a", "waiting for room", func(st state.Status) bool {
		return st.Phase == state.PhasePending && st.Reason != "" && st.Reason != "Queued"
	})
	if warned(t, c.cli, "vision-1") {
		t.Error("vision-1 was warned; it is within its team's guarantee")
	}
}

// counted is the controller's team preemptions counter for the labels.
func counted(t *testing.T, ctl *Controller, team, by, reason string) float64 {
	t.Helper()
	var m dto.Metric
	if err := ctl.teamPreempts.vec.WithLabelValues(team, by, reason).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
