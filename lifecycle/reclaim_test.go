package lifecycle

import (
	"context"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	clientv3 "go.etcd.io/etcd/client/v3"

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
	seen := c.watchStatus("nlp-a")
	w, wr := waitKey(t, c.cli, keys.Warning("nlp-a"), "nlp-a's reclaim warning", func(w state.Warning, found bool) bool { return found })
	if w.Reason != state.ReasonPreempted || w.By != "vision-1" ||
		!strings.Contains(w.Message, "team vision reclaims its guarantee") || !strings.Contains(w.Message, "your team nlp holds 8 GPUs, 6 over its guarantee of 2") {
		t.Fatalf("warning %+v, want nlp-a preempted for vision-1 with the team's reason", w)
	}
	// The warning's transaction wrote the node into vision-1's queue
	// entry: the placers hold it for vision-1 until it binds.
	assertHeldFor(t, c, "vision-1", wr.Kvs[0].ModRevision, w)
	vis := c.running("vision-1")
	if vis.Started == nil || vis.Started.Before(w.StopAt) {
		t.Fatalf("vision-1 started at %v, before nlp-a's grace ended at %s", vis.Started, w.StopAt)
	}
	c.status("nlp-a", "re-queued", func(st state.Status) bool { return st.Phase == state.PhasePending && st.RetryAt == nil })
	assertRequeuedBecause(t, seen, "preempted by vision-1: team vision reclaims its guarantee")
	// The warning names the reclaiming team; the stop (its eviction
	// message, while it stops) says it was a reclaim, and counts in the
	// team's preemptions by reason.
	if w.Reclaim != "vision" {
		t.Errorf("warning's reclaim %q, want vision", w.Reclaim)
	}
	if m := preemptedMessage(w); !strings.HasPrefix(m, "preempted by vision-1: team vision reclaims its guarantee") {
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

// assertHeldFor checks that, at rev (the revision of w, the warning of a
// preemption for id), id's queue entry held w's node until w's stop time
// and one grace more.
func assertHeldFor(t *testing.T, c *chain, id string, rev int64, w state.Warning) {
	t.Helper()
	r, err := c.cli.Get(context.Background(), keys.Pending(id), clientv3.WithRev(rev))
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("%s's queue entry at revision %d: %v %v", id, rev, r, err)
	}
	e, err := state.Decode[state.QueueEntry](r.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	if e.Hold == nil || e.Hold.Node != w.Node || !e.Hold.Until.After(w.StopAt) || r.Kvs[0].ModRevision != rev {
		t.Fatalf("%s's queue entry %+v (hold %+v) at revision %d, want it to hold %s past %s, written with the warning", id, e, e.Hold, r.Kvs[0].ModRevision, w.Node, w.StopAt)
	}
}

// assertRequeuedBecause checks that one of the statuses seen says want.
func assertRequeuedBecause(t *testing.T, seen func() []state.Status, want string) {
	t.Helper()
	var msgs []string
	for _, st := range seen() {
		if strings.Contains(st.Message, want) {
			return
		}
		msgs = append(msgs, st.Message)
	}
	t.Errorf("statuses %q, want one saying %q", msgs, want)
}

// TestReclaimFairShareBeyondGuarantee runs the placer, the lifecycle
// controller and an agent on one 8-GPU node: teams vision and nlp, a
// guarantee of 2 GPUs each and equal weights. nlp borrows all 8 GPUs with
// four 2-GPU preemptible jobs of priority 10; vision then asks for three
// 2-GPU jobs at priority 0. Both ask for more than half, so vision's fair
// share is its 2 and half of the 4 beyond the guarantees: 4. The
// controller reclaims two of nlp's jobs, not one: the first for vision's
// guarantee, the second for its fair share, its warning and the status it
// is re-queued with saying so and by how much nlp was over its share; the
// node stays held for each preemptor through its victim's stop (its queue
// entry's hold). vision's third job waits, naming its team's state (the
// words for a team at its fair share: TestTeamWaitingReasonNamesTheFairShare);
// nlp keeps its other two jobs, vision its two: after the controller's
// further passes nobody else is warned. Reclaiming only to the guarantee,
// vision got 2 GPUs.
func TestReclaimFairShareBeyondGuarantee(t *testing.T) {
	c := newChain(t, ControllerConfig{PreemptGrace: 300 * time.Millisecond})
	ctx := context.Background()
	for _, tm := range []state.Team{{Name: "vision", Guarantee: state.TeamGuarantee{GPUs: 2}}, {Name: "nlp", Guarantee: state.TeamGuarantee{GPUs: 2}}} {
		tr, err := state.ReadTeams(ctx, c.cli, keys)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := state.PutTeam(ctx, c.cli, keys, tr, tm); err != nil {
			t.Fatal(err)
		}
	}
	inTeam := func(team string) func(*state.Session) { return func(s *state.Session) { s.Team = team } }
	nlp := []string{"nlp-a", "nlp-b", "nlp-c", "nlp-d"}
	for _, id := range nlp {
		c.submit(id, 2, 10, true, inTeam("nlp"))
	}
	for _, id := range nlp {
		c.running(id)
	}
	seen := map[string]func() []state.Status{}
	for _, id := range nlp {
		seen[id] = c.watchStatus(id)
	}
	for _, id := range []string{"vision-1", "vision-2", "vision-3"} {
		c.submit(id, 2, 0, false, inTeam("vision"))
	}
	// Two reclaims, one after the other: one node, held for one
	// preemptor at a time.
	victims := map[string]state.Warning{}
	deadline := time.Now().Add(30 * time.Second)
	for len(victims) < 2 && time.Now().Before(deadline) {
		for _, id := range nlp {
			if _, ok := victims[id]; ok {
				continue
			}
			r, err := c.cli.Get(ctx, keys.Warning(id))
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Kvs) == 0 {
				continue
			}
			w, err := state.Decode[state.Warning](r.Kvs[0].Value)
			if err != nil {
				t.Fatal(err)
			}
			victims[id] = w
			assertHeldFor(t, c, w.By, r.Kvs[0].ModRevision, w)
		}
		time.Sleep(20 * time.Millisecond) // polling etcd, not a stand-in for a condition
	}
	if len(victims) != 2 {
		t.Fatalf("victims %v, want two of nlp's jobs reclaimed", victims)
	}
	var guarantee, fair int
	for id, w := range victims {
		switch {
		case strings.Contains(w.Why, "team vision reclaims its guarantee (it holds 0 of its 2 guaranteed GPUs)"):
			guarantee++
		case strings.Contains(w.Why, "team vision reclaims its fair share (it holds 2 GPUs of a fair share of 4, guarantee 2); your team nlp holds 6 GPUs, 2 over its fair share of 4 (guarantee 2)"):
			fair++
			c.status(id, "re-queued", func(st state.Status) bool { return st.Phase == state.PhasePending })
			assertRequeuedBecause(t, seen[id], "preempted by "+w.By+": team vision reclaims its fair share")
		default:
			t.Errorf("%s's warning %+v, want a reclaim by guarantee or by fair share", id, w)
		}
		if !strings.Contains(w.Message, w.Why) {
			t.Errorf("%s's warning says %q, want it to say %q", id, w.Message, w.Why)
		}
	}
	if guarantee != 1 || fair != 1 {
		t.Fatalf("reclaims by guarantee %d, by fair share %d, want one each", guarantee, fair)
	}
	running := 0
	for _, id := range []string{"vision-1", "vision-2", "vision-3"} {
		st, _ := waitKey(t, c.cli, keys.Status(id), id+" placed or waiting on its fair share", func(st state.Status, found bool) bool {
			return found && (st.Phase == state.PhaseRunning || st.Phase == state.PhasePending && st.Reason == "Capacity" && strings.Contains(st.Message, "team vision holds"))
		})
		if st.Phase == state.PhaseRunning {
			running++
		}
	}
	if running != 2 {
		t.Fatalf("%d of vision's jobs run, want 2 (its fair share of 4 GPUs)", running)
	}
	// Settled: the controller's passes go on, and nobody else is warned.
	from := c.ctl.passes()
	waitFor(t, "five more controller passes", func() bool { return c.ctl.passes() >= from+5 })
	for _, id := range append(nlp, "vision-1", "vision-2", "vision-3") {
		if _, ok := victims[id]; !ok && warned(t, c.cli, id) {
			t.Errorf("%s was warned after the reclaims settled", id)
		}
	}
	if n := counted(t, c.ctl, "nlp", "vision", "reclaim"); n != 2 {
		t.Errorf("voyager_lifecycle_team_preemptions_total{team=nlp,by_team=vision,reason=reclaim} = %v, want 2", n)
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
