package nodeagent_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/fence"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/state"
)

// TestAgentWritesTheFenceHeartbeat: with a fence directory the agent
// writes a heartbeat whose deadline is its last renewal's send plus the
// fence deadline, on the boot-time clock, moving on with every renewal,
// and naming the container of every binding before it exists.
func TestAgentWritesTheFenceHeartbeat(t *testing.T) {
	cli := etcdtest.New(t)
	cfg := testConfig(t, cli, newFake())
	cfg.FenceDir = t.TempDir()
	runAgent(t, cfg)
	b := bind(t, cli, state.Session{ID: "beat", Owner: "ada", Kind: state.KindBatch, Command: []string{"sleep", "1d"}}, state.Binding{})
	waitPhase(t, cli, "beat", state.PhaseRunning, 10*time.Second)
	first, err := fence.ReadHeartbeat(cfg.FenceDir)
	if err != nil {
		t.Fatal(err)
	}
	if first.Deadline-first.Renewed != int64(cfg.FenceAfter) || first.Grace != cfg.FenceGrace || first.PID != os.Getpid() || first.Node != node {
		t.Fatalf("heartbeat %+v; want deadline = renewed + %s, grace %s, this pid, node %s", first, cfg.FenceAfter, cfg.FenceGrace, node)
	}
	if first.Deadline <= fence.Now() {
		t.Fatalf("heartbeat deadline %d is not in the future (now %d)", first.Deadline, fence.Now())
	}
	if !slices.Contains(first.Containers, nodeagent.ContainerID(b)) {
		t.Fatalf("heartbeat lists %v; want the binding's container %s", first.Containers, nodeagent.ContainerID(b))
	}
	waitFor(t, "a renewal to move the deadline on", 3*cfg.FenceAfter, func() (bool, string) {
		hb, err := fence.ReadHeartbeat(cfg.FenceDir)
		return err == nil && hb.Deadline > first.Deadline, ""
	})
}

// TestAgentReportsAKeeperFenceAsFenced: the fence keeper killed a running
// container while the agent thought its lease fine (it was paused past the
// deadline and resumed, say). The container's end is the fence's, not the
// job's: the attempt ends Fenced (Lost for a job without restarts) with
// the keeper's cause, not Failed with the kill's exit code.
func TestAgentReportsAKeeperFenceAsFenced(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	cfg := testConfig(t, cli, rt)
	cfg.FenceDir = t.TempDir()
	a, _ := runAgent(t, cfg)
	b := bind(t, cli, state.Session{ID: "killed", Owner: "ada", Kind: state.KindBatch, Command: []string{"sleep", "1d"}}, state.Binding{})
	waitPhase(t, cli, "killed", state.PhaseRunning, 10*time.Second)
	id := nodeagent.ContainerID(b)
	cause := "fenced by the node's fence keeper: its agent (pid 1) had not renewed the node lease for 6.1s"
	if err := fence.WriteRecord(cfg.FenceDir, fence.Record{Container: id, At: time.Now().UTC(), By: "keeper", Cause: cause}); err != nil {
		t.Fatal(err)
	}
	if err := rt.Finish(id, 137, ""); err != nil {
		t.Fatal(err)
	}
	st := waitPhase(t, cli, "killed", state.PhaseLost, 10*time.Second)
	if st.Reason != state.ReasonFenced || !strings.Contains(st.Message, cause) || st.ExitCode != nil {
		t.Fatalf("status %s %s %q exit %v; want Lost, Fenced, the keeper's cause, no exit code", st.Phase, st.Reason, st.Message, st.ExitCode)
	}
	waitFor(t, "the container and its record removed", 10*time.Second, func() (bool, string) {
		_, ok, _ := fence.ReadRecord(cfg.FenceDir, id)
		_, err := rt.Status(context.Background(), id)
		return !ok && err != nil, ""
	})
	if a.FencedAttempts() != 1 || rt.Starts() != 1 {
		t.Fatalf("%d fenced attempts, %d starts; want 1 and 1", a.FencedAttempts(), rt.Starts())
	}
}
