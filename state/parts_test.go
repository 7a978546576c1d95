package state_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// at returns a time t seconds after a fixed start, for readable cases.
func at(t int) *time.Time {
	v := time.Date(2026, 11, 23, 9, 0, t, 0, time.UTC)
	return &v
}

func code(c int) *int { return &c }

// part builds the part of rank r on node n (rank 0 is the head).
func part(r int, n string, ph state.Phase, mods ...func(*state.PartStatus)) state.PartStatus {
	role := state.RoleWorker
	if r == 0 {
		role = state.RoleHead
	}
	p := state.PartStatus{Session: "s1", Node: n, Role: role, Rank: r, Phase: ph, QueueRevision: 7, Updated: *at(r)}
	for _, m := range mods {
		m(&p)
	}
	return p
}

func single(ph state.Phase, mods ...func(*state.PartStatus)) state.PartStatus {
	p := part(0, "n1", ph, mods...)
	p.Role = state.RoleSingle
	return p
}

func exited(c int, fin int) func(*state.PartStatus) {
	return func(p *state.PartStatus) {
		p.ExitCode, p.Finished, p.Updated, p.Reason = code(c), at(fin), *at(fin), "Exited"
		p.Message = "exited"
		if p.Started == nil {
			p.Started = at(1)
		}
	}
}

func started(s int) func(*state.PartStatus) {
	return func(p *state.PartStatus) { p.Started, p.Reason = at(s), "Started" }
}

func waits(reason string) func(*state.PartStatus) {
	return func(p *state.PartStatus) { p.Reason, p.RetryAt, p.Message = reason, at(90), "again" }
}

// TestMergeParts is the merge rule, case by case: the event, the phase it
// gives, and what the status carries.
func TestMergeParts(t *testing.T) {
	batch := state.Session{ID: "s1", Kind: state.KindBatch, Desired: state.DesiredRunning}
	onFailure := batch
	onFailure.Restart = state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 2}
	stopped := onFailure
	stopped.Desired = state.DesiredStopped
	preempted := batch
	preempted.Eviction = &state.Eviction{Reason: state.ReasonPreempted, Requeue: true}
	stoppedPreempted := preempted
	stoppedPreempted.Desired = state.DesiredStopped
	notebook := state.Session{ID: "s1", Kind: state.KindNotebook, Desired: state.DesiredRunning, Ray: &state.Ray{Workers: 1}}
	gang := batch
	gang.Nodes = 3
	gangOnFailure := gang
	gangOnFailure.Restart = onFailure.Restart
	gangContinue := gang
	gangContinue.OnPartFailure = state.PartFailureContinue

	status := func(ph state.Phase, nodes ...string) state.Status {
		if len(nodes) == 0 {
			nodes = []string{"n1"}
		}
		return state.Status{Session: "s1", Phase: ph, Nodes: nodes, QueueRevision: 7}
	}
	gangStatus := func(ph state.Phase) state.Status { return status(ph, "n1", "n2", "n3") }
	running := status(state.PhaseRunning)
	running.Started = at(1)
	running.Reason = "Started"

	type want struct {
		changed bool
		event   state.Event
		phase   state.Phase
		code    *int
		msg     string // a substring of the message
		check   func(t *testing.T, st state.Status)
	}
	for _, tc := range []struct {
		name  string
		spec  state.Session
		cur   state.Status
		parts []state.PartStatus
		want  want
		err   bool
	}{
		// One part decides.
		{name: "no part yet", spec: batch, cur: status(state.PhaseBound), want: want{}},
		{name: "a part not reported yet", spec: batch, cur: status(state.PhaseBound), parts: []state.PartStatus{single(state.PhaseBound)}, want: want{}},
		{name: "pulling", spec: batch, cur: status(state.PhaseBound), parts: []state.PartStatus{single(state.PhaseStarting)},
			want: want{changed: true, event: state.EventCreate, phase: state.PhaseStarting}},
		{name: "running with URLs and activity", spec: batch, cur: status(state.PhaseStarting),
			parts: []state.PartStatus{single(state.PhaseRunning, started(1), func(p *state.PartStatus) {
				p.URLs = map[string]string{"logs": "https://n1/logs"}
				p.Activity = &state.Activity{LastActive: *at(1)}
			})},
			want: want{changed: true, event: state.EventStart, phase: state.PhaseRunning, check: func(t *testing.T, st state.Status) {
				if st.Started == nil || !st.Started.Equal(*at(1)) || st.URLs["logs"] != "https://n1/logs" || st.Activity == nil {
					t.Errorf("status = %+v, want the part's start, URLs and activity", st)
				}
			}}},
		{name: "a new activity sample is an observation", spec: batch, cur: running,
			parts: []state.PartStatus{single(state.PhaseRunning, started(1), func(p *state.PartStatus) { p.Activity = &state.Activity{LastActive: *at(5)} })},
			want:  want{changed: true, event: state.EventObserve, phase: state.PhaseRunning}},
		{name: "nothing new writes nothing", spec: batch, cur: running, parts: []state.PartStatus{single(state.PhaseRunning, started(1))}, want: want{}},
		{name: "succeeded", spec: batch, cur: running, parts: []state.PartStatus{single(state.PhaseSucceeded, exited(0, 9))},
			want: want{changed: true, event: state.EventSucceed, phase: state.PhaseSucceeded, code: code(0), check: func(t *testing.T, st state.Status) {
				if st.Finished == nil || !st.Finished.Equal(*at(9)) {
					t.Errorf("finished = %v, want the part's", st.Finished)
				}
			}}},
		{name: "failed", spec: batch, cur: running, parts: []state.PartStatus{single(state.PhaseFailed, exited(2, 9))},
			want: want{changed: true, event: state.EventFail, phase: state.PhaseFailed, code: code(2)}},
		{name: "stopped", spec: stopped, cur: status(state.PhaseStopping), parts: []state.PartStatus{single(state.PhaseStopped, exited(143, 9))},
			want: want{changed: true, event: state.EventHalt, phase: state.PhaseStopped, code: code(143)}},
		{name: "stopping", spec: stopped, cur: running, parts: []state.PartStatus{single(state.PhaseStopping, started(1))},
			want: want{changed: true, event: state.EventStop, phase: state.PhaseStopping}},
		{name: "back-off waits without its Jupyter URL", spec: onFailure, cur: running,
			parts: []state.PartStatus{single(state.PhasePending, exited(1, 9), waits(state.ReasonBackOff), func(p *state.PartStatus) {
				p.Finished, p.URLs = nil, map[string]string{"jupyter": "http://n1/", "logs": "https://n1/logs"}
				p.Activity = &state.Activity{}
			})},
			want: want{changed: true, event: state.EventBackOff, phase: state.PhasePending, check: func(t *testing.T, st state.Status) {
				if !st.Waiting() || st.Finished != nil || st.Activity != nil || st.URLs["jupyter"] != "" || st.URLs["logs"] == "" {
					t.Errorf("status = %+v, want waiting, unfinished, no activity, no Jupyter URL, the log URL", st)
				}
			}}},
		{name: "a stop after the agent chose back-off ends it stopped", spec: stopped, cur: running,
			parts: []state.PartStatus{single(state.PhasePending, exited(1, 9), waits(state.ReasonBackOff))},
			want:  want{changed: true, event: state.EventHalt, phase: state.PhaseStopped, msg: "stopped on request"}},
		{name: "fenced with no restart left during a stop ends it stopped", spec: stopped, cur: running,
			parts: []state.PartStatus{single(state.PhaseLost, func(p *state.PartStatus) {
				p.Reason, p.Message, p.Finished = state.ReasonFenced, "fenced: etcd unreachable for 6.5s", at(9)
			})},
			want: want{changed: true, event: state.EventHalt, phase: state.PhaseStopped, msg: "fenced: etcd unreachable"}},
		{name: "fenced with no restart left ends it lost", spec: batch, cur: running,
			parts: []state.PartStatus{single(state.PhaseLost, func(p *state.PartStatus) {
				p.Reason, p.Message, p.Finished = state.ReasonFenced, "fenced", at(9)
			})},
			want: want{changed: true, event: state.EventFencedLost, phase: state.PhaseLost}},
		{name: "preempted", spec: preempted, cur: status(state.PhaseStopping), parts: []state.PartStatus{single(state.PhasePending, waits(state.ReasonPreempted))},
			want: want{changed: true, event: state.EventPreempt, phase: state.PhasePending}},
		{name: "a stop after the agent chose re-queue ends it stopped", spec: stoppedPreempted, cur: status(state.PhaseStopping),
			parts: []state.PartStatus{single(state.PhasePending, waits(state.ReasonPreempted))},
			want:  want{changed: true, event: state.EventHalt, phase: state.PhaseStopped}},
		{name: "no restarts left fails", spec: batch, cur: running, parts: []state.PartStatus{single(state.PhasePending, exited(1, 9), waits(state.ReasonBackOff))},
			want: want{changed: true, event: state.EventFail, phase: state.PhaseFailed, code: code(1)}},
		{name: "an ended status takes nothing", spec: batch, cur: status(state.PhaseSucceeded), parts: []state.PartStatus{single(state.PhaseFailed, exited(1, 9))}, want: want{}},
		{name: "a waiting status takes nothing", spec: batch, cur: status(state.PhasePending), parts: []state.PartStatus{single(state.PhaseRunning)}, want: want{}},
		{name: "no way back from stopping", spec: stopped, cur: status(state.PhaseStopping), parts: []state.PartStatus{single(state.PhaseRunning, started(1))}, err: true},

		// Ray: the head decides, workers never do.
		{name: "a Ray worker's failure changes nothing", spec: notebook, cur: running,
			parts: []state.PartStatus{part(0, "n1", state.PhaseRunning, started(1)), part(1, "n2", state.PhaseFailed, exited(1, 5))}, want: want{}},
		{name: "a Ray session ends with its head", spec: notebook, cur: running,
			parts: []state.PartStatus{part(1, "n2", state.PhaseRunning, started(1)), part(0, "n1", state.PhaseStopped, exited(0, 5))},
			want:  want{changed: true, event: state.EventHalt, phase: state.PhaseStopped}},
		{name: "a Ray worker alone starts nothing", spec: notebook, cur: status(state.PhaseBound),
			parts: []state.PartStatus{part(1, "n2", state.PhaseRunning, started(1))}, want: want{}},

		// Multi-node batch jobs.
		{name: "gang: starting until every part runs", spec: gang, cur: gangStatus(state.PhaseBound),
			parts: []state.PartStatus{part(0, "n1", state.PhaseRunning, started(1)), part(1, "n2", state.PhaseStarting)},
			want:  want{changed: true, event: state.EventCreate, phase: state.PhaseStarting, msg: "1 of 3 parts running"}},
		{name: "gang: running once all run, from the last start", spec: gang, cur: gangStatus(state.PhaseStarting),
			parts: []state.PartStatus{part(0, "n1", state.PhaseRunning, started(1)), part(1, "n2", state.PhaseRunning, started(4)), part(2, "n3", state.PhaseRunning, started(2))},
			want: want{changed: true, event: state.EventStart, phase: state.PhaseRunning, msg: "all 3 parts running", check: func(t *testing.T, st state.Status) {
				if st.Started == nil || !st.Started.Equal(*at(4)) {
					t.Errorf("started = %v, want the last part's start", st.Started)
				}
			}}},
		{name: "gang: a failed part ends the job with its code (StopAll)", spec: gang, cur: gangStatus(state.PhaseRunning),
			parts: []state.PartStatus{part(0, "n1", state.PhaseRunning, started(1)), part(1, "n2", state.PhaseFailed, exited(3, 6)), part(2, "n3", state.PhaseRunning, started(2))},
			want:  want{changed: true, event: state.EventFail, phase: state.PhaseFailed, code: code(3), msg: "part 1 on n2"}},
		{name: "gang: the first failure decides", spec: gang, cur: gangStatus(state.PhaseRunning),
			parts: []state.PartStatus{part(0, "n1", state.PhaseFailed, exited(9, 8)), part(1, "n2", state.PhaseFailed, exited(3, 7)), part(2, "n3", state.PhaseFailed, exited(4, 6))},
			want:  want{changed: true, event: state.EventFail, phase: state.PhaseFailed, code: code(4), msg: "part 2 on n3"}},
		{name: "gang: a failure before rank 0's success decides", spec: gang, cur: gangStatus(state.PhaseRunning),
			parts: []state.PartStatus{part(0, "n1", state.PhaseSucceeded, exited(0, 8)), part(1, "n2", state.PhaseFailed, exited(3, 7)), part(2, "n3", state.PhaseRunning, started(1))},
			want:  want{changed: true, event: state.EventFail, phase: state.PhaseFailed, code: code(3)}},
		{name: "gang: rank 0 ends the job", spec: gang, cur: gangStatus(state.PhaseRunning),
			parts: []state.PartStatus{part(0, "n1", state.PhaseSucceeded, exited(0, 8)), part(1, "n2", state.PhaseRunning, started(1)), part(2, "n3", state.PhaseRunning, started(1))},
			want:  want{changed: true, event: state.EventSucceed, phase: state.PhaseSucceeded, code: code(0)}},
		{name: "gang: a worker done early keeps the job running", spec: gang, cur: gangStatus(state.PhaseRunning),
			parts: []state.PartStatus{part(0, "n1", state.PhaseRunning, started(1)), part(1, "n2", state.PhaseSucceeded, exited(0, 5)), part(2, "n3", state.PhaseRunning, started(1))},
			want:  want{changed: true, event: state.EventObserve, phase: state.PhaseRunning}},
		{name: "gang: Continue outlives a failed part", spec: gangContinue, cur: gangStatus(state.PhaseRunning),
			parts: []state.PartStatus{part(0, "n1", state.PhaseRunning, started(1)), part(1, "n2", state.PhaseFailed, exited(3, 5)), part(2, "n3", state.PhaseRunning, started(1))},
			want:  want{changed: true, event: state.EventObserve, phase: state.PhaseRunning}},
		{name: "gang: Continue ends with rank 0's outcome", spec: gangContinue, cur: gangStatus(state.PhaseRunning),
			parts: []state.PartStatus{part(0, "n1", state.PhaseSucceeded, exited(0, 8)), part(1, "n2", state.PhaseFailed, exited(3, 5)), part(2, "n3", state.PhaseRunning, started(1))},
			want:  want{changed: true, event: state.EventSucceed, phase: state.PhaseSucceeded, code: code(0)}},
		{name: "gang: any part stopping stops the job", spec: gang, cur: gangStatus(state.PhaseRunning),
			parts: []state.PartStatus{part(0, "n1", state.PhaseRunning, started(1)), part(1, "n2", state.PhaseStopping, func(p *state.PartStatus) { p.Reason = "StopRequested" })},
			want:  want{changed: true, event: state.EventStop, phase: state.PhaseStopping}},
		{name: "gang: a part's back-off restarts the job", spec: gangOnFailure, cur: gangStatus(state.PhaseRunning),
			parts: []state.PartStatus{part(0, "n1", state.PhaseRunning, started(1)), part(2, "n3", state.PhasePending, exited(1, 5), waits(state.ReasonBackOff))},
			want:  want{changed: true, event: state.EventBackOff, phase: state.PhasePending}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, st, changed, err := state.MergeParts(tc.spec, tc.cur, tc.parts, *at(100))
			if tc.err {
				if !errors.Is(err, state.ErrIllegalTransition) {
					t.Fatalf("err = %v, want ErrIllegalTransition", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if changed != tc.want.changed {
				t.Fatalf("changed = %v (event %s, phase %s), want %v", changed, ev, st.Phase, tc.want.changed)
			}
			if !changed {
				if ev != "" || st.Phase != tc.cur.Phase {
					t.Errorf("unchanged merge returned event %q, phase %s", ev, st.Phase)
				}
				return
			}
			if ev != tc.want.event || st.Phase != tc.want.phase {
				t.Errorf("event, phase = %s, %s; want %s, %s", ev, st.Phase, tc.want.event, tc.want.phase)
			}
			if tc.want.code != nil && (st.ExitCode == nil || *st.ExitCode != *tc.want.code) {
				t.Errorf("exit code = %v, want %d", st.ExitCode, *tc.want.code)
			}
			if !strings.Contains(st.Message, tc.want.msg) {
				t.Errorf("message = %q, want it to say %q", st.Message, tc.want.msg)
			}
			if st.Phase.Terminal() && st.Finished == nil {
				t.Error("an ended status has no finished time")
			}
			if st.Session != "s1" || st.QueueRevision != 7 || len(st.Nodes) != len(tc.cur.Nodes) {
				t.Errorf("identity changed: %+v", st)
			}
			if !st.Updated.Equal(*at(100)) {
				t.Errorf("updated = %v, want now", st.Updated)
			}
			if ok, _ := state.Edge(tc.cur.Phase, st.Phase); !ok {
				t.Errorf("%s → %s is no edge of the state machine", tc.cur.Phase, st.Phase)
			}
			if tc.want.check != nil {
				tc.want.check(t, st)
			}
		})
	}
}

// TestStatusCurrent: only parts of the status's nodes and queueing count.
func TestStatusCurrent(t *testing.T) {
	st := state.Status{Nodes: []string{"n1", "n2"}, QueueRevision: 7}
	for _, tc := range []struct {
		p    state.PartStatus
		want bool
	}{
		{state.PartStatus{Node: "n1", QueueRevision: 7}, true},
		{state.PartStatus{Node: "n2", QueueRevision: 7}, true},
		{state.PartStatus{Node: "n3", QueueRevision: 7}, false},
		{state.PartStatus{Node: "n1", QueueRevision: 6}, false},
	} {
		if got := st.Current(tc.p); got != tc.want {
			t.Errorf("Current(%+v) = %v, want %v", tc.p, got, tc.want)
		}
	}
	old := state.Status{Nodes: []string{"n1"}}
	if !old.Current(state.PartStatus{Node: "n1", QueueRevision: 9}) {
		t.Error("a status from before part keys refuses its node's part")
	}
}

// TestMergePartsOfARangeOfMachines: an elastic job over a range of
// machines (spec Nodes = MaxNodes) runs when every part of its current
// attempt runs, as many as its status was bound at (JobNodes), not
// MaxNodes; rank 0 alone on one machine decides as a job on one machine's
// part does.
func TestMergePartsOfARangeOfMachines(t *testing.T) {
	spec := state.Session{ID: "s1", Kind: state.KindBatch, Desired: state.DesiredRunning, Nodes: 3,
		Elastic: &state.Elastic{MinNodes: 1, MaxNodes: 3}}
	for _, c := range []struct {
		name  string
		nodes []string
		parts []state.PartStatus
		want  state.Phase
		msg   string
	}{
		{"two of two parts running", []string{"n1", "n2"},
			[]state.PartStatus{part(0, "n1", state.PhaseRunning, started(1)), part(1, "n2", state.PhaseRunning, started(2))}, state.PhaseRunning, "all 2 parts running"},
		{"one of two parts running", []string{"n1", "n2"},
			[]state.PartStatus{part(0, "n1", state.PhaseRunning, started(1)), part(1, "n2", state.PhaseStarting)}, state.PhaseStarting, "1 of 2 parts running"},
		{"rank 0 alone on one machine", []string{"n1"},
			[]state.PartStatus{part(0, "n1", state.PhaseRunning, started(1))}, state.PhaseRunning, ""}, // its one part decides, as a job on one machine's
	} {
		t.Run(c.name, func(t *testing.T) {
			cur := state.Status{Session: "s1", Phase: state.PhaseStarting, Nodes: c.nodes, QueueRevision: 7,
				Elastic: &state.Elastic{MinNodes: 1, MaxNodes: 3, Nodes: len(c.nodes), Size: 2 * len(c.nodes)}}
			if got := spec.JobNodes(cur); got != len(c.nodes) {
				t.Errorf("JobNodes = %d, want %d", got, len(c.nodes))
			}
			_, st, _, err := state.MergeParts(spec, cur, c.parts, *at(10))
			if err != nil {
				t.Fatal(err)
			}
			if st.Phase != c.want || st.Message != c.msg {
				t.Errorf("merged %s %q, want %s %q", st.Phase, st.Message, c.want, c.msg)
			}
		})
	}
	if got := spec.JobNodes(state.Status{}); got != 3 {
		t.Errorf("JobNodes before any bind = %d, want MaxNodes 3", got)
	}
}
