package nodeagent_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// TestAgentFencesThroughEtcdOutage: etcd goes away for longer than the
// lease. The agent cannot renew it and fences: the session's container is
// stopped and removed (the placers would re-queue it once the lease
// expires). etcd comes back with the same data and no placer has run, so
// the binding is still there when the agent registers anew. The attempt
// had launched (its part records it), so the agent never starts it again
// in place: it ends the attempt with reason Fenced, the outage in the
// message, and the state machine decides what follows: Lost for a session
// without restarts, Pending (to be re-queued as the next attempt) for an
// OnFailure one. Before, the agent started the same attempt again.
func TestAgentFencesThroughEtcdOutage(t *testing.T) {
	for _, tc := range []struct {
		name    string
		restart state.RestartPolicy
		want    state.Phase
	}{
		{"never", state.RestartPolicy{}, state.PhaseLost},
		{"on-failure", state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 2}, state.PhasePending},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := etcdtest.Start(t, etcdtest.Options{})
			dir, addr := c.Dir, strings.TrimPrefix(c.Server.Endpoint(), "http://")
			cli := c.Client(t)
			rt := newFake()
			a, _ := runAgent(t, testConfig(t, cli, rt))
			b := bind(t, cli, state.Session{ID: "survivor", Owner: "ada", Kind: state.KindBatch, Command: []string{"sleep", "1d"}, Restart: tc.restart}, state.Binding{})
			waitPhase(t, cli, "survivor", state.PhaseRunning, 10*time.Second)

			c.Server.Close()
			waitFor(t, "the agent to fence", 20*time.Second, func() (bool, string) {
				return a.Fences() == 1 && !a.Registered(), ""
			})
			if in, err := rt.Status(context.Background(), nodeagent.ContainerID(b)); !errors.Is(err, runtime.ErrNotFound) {
				t.Fatalf("with etcd down past the fence deadline: %+v, %v; want the container gone", in, err)
			}

			etcdtest.Start(t, etcdtest.Options{Dir: dir, ClientAddr: addr})
			waitFor(t, "a second registration", 30*time.Second, func() (bool, string) { return a.Registrations() >= 2, "" })
			st := waitPhase(t, cli, "survivor", tc.want, 30*time.Second)
			if st.Reason != state.ReasonFenced || !strings.Contains(st.Message, "last renewed") || !strings.Contains(st.Message, "outage: no renewal from") || !strings.Contains(st.Message, "attempt 0") {
				t.Fatalf("status %s %s %q; want reason Fenced and the outage in the message", st.Phase, st.Reason, st.Message)
			}
			if tc.want == state.PhasePending && (st.RetryAt == nil || !st.Waiting()) {
				t.Fatalf("status %+v; want it waiting to be re-queued", st)
			}
			if !gone(t, cli, keys.Binding(node, "survivor")) {
				t.Fatal("the fenced attempt's binding is still there")
			}
			if l, _, err := state.Get[state.Ledger](context.Background(), cli, keys.Ledger(node)); err == nil && l.Allocations["survivor"].Owner != "" {
				t.Fatalf("the fenced attempt still holds %+v", l.Allocations["survivor"])
			}
			if _, err := rt.Status(context.Background(), nodeagent.ContainerID(b)); !errors.Is(err, runtime.ErrNotFound) {
				t.Fatalf("container after the fence: %v; want none", err)
			}
			if rt.Starts() != 1 || a.FencedAttempts() != 1 {
				t.Fatalf("%d starts, %d fenced attempts; want the one start, ended as fenced", rt.Starts(), a.FencedAttempts())
			}
		})
	}
}
