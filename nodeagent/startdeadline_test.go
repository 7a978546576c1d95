package nodeagent_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// stuckPull is a runtime whose pulls of image "slow:1" never end until
// their context does: a registry that stopped answering.
type stuckPull struct{ *runtime.Fake }

func (r stuckPull) EnsureImage(ctx context.Context, ref string) error {
	if ref != "slow:1" {
		return r.Fake.EnsureImage(ctx, ref)
	}
	<-ctx.Done()
	return ctx.Err()
}

// TestStartDeadline is point 5 of issue 33: a session that is not running
// within the agent's start timeout of its bind ends Failed, reason
// StartFailed, its message naming the stage it was stuck at, and releases
// its binding and allocation, with its container removed: a notebook
// whose Jupyter never answers (readiness), a batch job whose image pull
// hangs (pull). Before, the notebook stayed Starting, holding its GPU, and
// the pull never ended.
func TestStartDeadline(t *testing.T) {
	cli := etcdtest.New(t)
	rt := stuckPull{newFake()}
	cfg := testConfig(t, cli, rt)
	cfg.StartTimeout = 2 * time.Second
	runAgent(t, cfg)
	for _, tc := range []struct {
		name   string
		sess   state.Session
		ports  []int
		stage  string
		report string // the part's reason while the stage lasts
	}{
		{"readiness", state.Session{ID: "nb1", Owner: "ada", Kind: state.KindNotebook}, []int{freePort(t)}, nodeagent.StageReadiness, "WaitingForJupyter"},
		{"pull", state.Session{ID: "job1", Owner: "ada", Kind: state.KindBatch, Image: "slow:1", Command: []string{"true"}}, nil, nodeagent.StagePull, "Pulling"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Watch the session's status for the stage's report.
			wctx, stopWatch := context.WithCancel(context.Background())
			defer stopWatch()
			seen := make(chan struct{})
			from, err := cli.Get(wctx, keys.Status(tc.sess.ID))
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				for resp := range cli.Watch(wctx, keys.Status(tc.sess.ID), clientv3.WithRev(from.Header.Revision+1)) {
					for _, ev := range resp.Events {
						if st, err := state.Decode[state.Status](ev.Kv.Value); err == nil && st.Reason == tc.report {
							close(seen)
							return
						}
					}
				}
			}()
			b := bind(t, cli, tc.sess, state.Binding{GPUs: []string{cfg.GPUs[0].UUID}, CPUMilli: 500, MemoryMiB: 256, Ports: tc.ports})
			st := waitPhase(t, cli, tc.sess.ID, state.PhaseFailed, 20*time.Second)
			reported := map[string]bool{}
			select {
			case <-seen:
				reported[tc.sess.ID] = true
			case <-time.After(5 * time.Second):
			}
			if st.Reason != nodeagent.ReasonStartFailed || !strings.Contains(st.Message, "stuck at "+tc.stage) {
				t.Errorf("final status %s %q, want StartFailed naming the stage %s", st.Reason, st.Message, tc.stage)
			}
			// Meanwhile the part said which stage it was in.
			if tc.report != "" && !reported[tc.sess.ID] {
				t.Errorf("the session's status never said %s while it started", tc.report)
			}
			if !gone(t, cli, keys.Binding(node, tc.sess.ID)) {
				t.Error("binding left after the start deadline")
			}
			if l, _, err := state.Get[state.Ledger](context.Background(), cli, keys.Ledger(node)); err == nil {
				if _, held := l.Allocations[tc.sess.ID]; held {
					t.Error("allocation left after the start deadline")
				}
			}
			waitFor(t, "the container removed", 10*time.Second, func() (bool, string) {
				_, err := rt.Status(context.Background(), nodeagent.ContainerID(b))
				return err != nil, ""
			})
		})
	}
}

// TestStartDeadlineSparesAdoptedRunningSession: an agent restarted long
// after its notebook's bind adopts the running container while Jupyter
// does not answer (it is restarting); the start deadline, long passed,
// does not end a session that already ran: it ends as its container
// does.
func TestStartDeadlineSparesAdoptedRunningSession(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	cfg := testConfig(t, cli, rt)
	_, stop := runAgent(t, cfg)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(302) })}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	b := bind(t, cli, state.Session{ID: "nb1", Owner: "ada", Kind: state.KindNotebook},
		state.Binding{CPUMilli: 500, MemoryMiB: 256, Ports: []int{l.Addr().(*net.TCPAddr).Port}})
	waitPhase(t, cli, "nb1", state.PhaseRunning, 10*time.Second)
	stop()
	srv.Close()                        // Jupyter stops answering
	cfg.StartTimeout = time.Nanosecond // long passed
	a, _ := runAgent(t, cfg)
	waitFor(t, "the restarted agent to register", 20*time.Second, func() (bool, string) { return a.Registered(), "" })
	if err := rt.Finish(nodeagent.ContainerID(b), 0, ""); err != nil {
		t.Fatal(err)
	}
	st := waitPhase(t, cli, "nb1", state.PhaseStopped, 20*time.Second)
	if st.Reason != "Exited" {
		t.Errorf("adopted notebook ended %s %q, want Stopped as its container exited", st.Reason, st.Message)
	}
}
