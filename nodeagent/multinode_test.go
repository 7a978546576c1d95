package nodeagent_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/state"
)

// mnPorts are the ports of a multi-node job's part from base on, as a
// placer gives them: MASTER_PORT and the peer ports for rank 0 (master),
// the peer ports for the others.
func mnPorts(base int, master bool) []int {
	var ps []int
	n := state.JobPeerPorts
	if master {
		n++
	}
	for i := 0; i < n; i++ {
		ps = append(ps, base+i)
	}
	return ps
}

// mnParts are the bindings of a 3-part job on ms: rank 0 on the first.
func mnParts(ms []machine, base int) []state.Binding {
	return []state.Binding{
		{Node: ms[0].name, Role: state.RoleHead, CPUMilli: 200, MemoryMiB: 128, Ports: mnPorts(base, true)},
		{Node: ms[1].name, Role: state.RoleWorker, Worker: 1, HeadNode: ms[0].name, CPUMilli: 200, MemoryMiB: 128, Ports: mnPorts(base+20, false)},
		{Node: ms[2].name, Role: state.RoleWorker, Worker: 2, HeadNode: ms[0].name, CPUMilli: 200, MemoryMiB: 128, Ports: mnPorts(base+40, false)},
	}
}

// TestMultiNodeJobAcrossMachines: a 3-part batch job on three simulated
// machines (network namespaces with their own addresses, each with its
// agent's isolated network). Its parts rendezvous with the image's
// stand-in of torchrun's (every rank reaches MASTER_ADDR:MASTER_PORT, and
// every rank every other rank's peer port) and the job succeeds; another
// owner's session on the job's machines reaches none of its ports, nor
// does anyone outside; killing one part of a running job fails the job
// with that part's exit code and stops the others.
func TestMultiNodeJobAcrossMachines(t *testing.T) {
	cli := etcdtest.New(t)
	ms := machines(t, 3)
	const first, last = 46000, 46199
	agents := machineAgents(t, cli, ms, "mn", first, last)
	logOf := partLogs(agents)
	job := func(id string, command ...string) state.Session {
		return state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Nodes: 3, OnPartFailure: state.PartFailureStopAll, Command: command}
	}

	// The rendezvous: every rank arrives exactly once and reaches every
	// other; the job succeeds.
	parts := bindParts(t, cli, job("mn-rdv", "rendezvous", "-timeout", "60s"), mnParts(ms, first))
	st := waitPhase(t, cli, "mn-rdv", state.PhaseSucceeded, 90*time.Second)
	if st.ExitCode == nil || *st.ExitCode != 0 {
		t.Errorf("rendezvous job: exit code %v, want 0", st.ExitCode)
	}
	for _, b := range parts {
		r := nodeagent.RankOf(b)
		waitFor(t, fmt.Sprintf("rank %d's log", r), logCopied, func() (bool, string) { // the shim may copy it a moment after the exit
			out := logOf(b)
			return strings.Contains(out, fmt.Sprintf("rank %d of 3: connected to every other rank", r)), out
		})
	}
	if out := logOf(parts[0]); strings.Count(out, "arrived from "+ms[1].addr) != 1 || strings.Count(out, "arrived from "+ms[2].addr) != 1 {
		t.Errorf("rank 0 did not see ranks 1 and 2 arrive once each, from their machines:\n%s", out)
	}

	// A job that runs on: rank 0 serves on MASTER_PORT after the
	// rendezvous, ranks 1 and 2 reach it there.
	serve := `rendezvous -timeout 60s || exit 1
if [ "$NODE_RANK" = 0 ]; then mkdir -p /tmp/www; echo master > /tmp/www/index.html; httpd -p "$MASTER_PORT" -h /tmp/www || exit 1
else until timeout 3 wget -q -O /dev/null "http://$MASTER_ADDR:$MASTER_PORT/"; do sleep 1; done; echo "MASTER REACHED from rank $NODE_RANK"; fi
exec sleep 600`
	long := bindParts(t, cli, job("mn-long", "sh", "-c", serve), mnParts(ms, first+100))
	waitPhase(t, cli, "mn-long", state.PhaseRunning, 60*time.Second)
	for _, b := range long[1:] {
		waitFor(t, fmt.Sprintf("rank %d to reach MASTER_PORT", b.Worker), 60*time.Second, func() (bool, string) {
			out := logOf(b)
			return strings.Contains(out, "MASTER REACHED"), out
		})
	}
	master := fmt.Sprintf("%s:%d", ms[0].addr, first+100)

	// From outside the machines: MASTER_PORT does not answer.
	c := http.Client{Timeout: 3 * time.Second}
	if resp, err := c.Get("http://" + master + "/"); err == nil {
		resp.Body.Close()
		t.Errorf("MASTER_PORT %s answers from outside the job", master)
	}

	// eve's sessions on the job's worker machines: the world outside
	// answers them; MASTER_PORT and the parts' peer ports do not.
	probeFromOthers(t, cli, ms[1:], "mn-eve", outsideServer(t, ms[0]), []string{master, fmt.Sprintf("%s:%d", ms[1].addr, first+120)}, logOf)

	// Killing rank 1 fails the job with its exit code and stops ranks 0
	// and 2.
	rt1 := agents[long[1].Node].Runtime
	if err := rt1.Stop(context.Background(), nodeagent.ContainerID(long[1]), 0); err != nil {
		t.Fatal(err)
	}
	st = waitPhase(t, cli, "mn-long", state.PhaseFailed, 60*time.Second)
	if st.ExitCode == nil || *st.ExitCode == 0 {
		t.Errorf("job with a killed part: exit code %v, want the killed part's (non-zero)", st.ExitCode)
	}
	for _, b := range long {
		rt := agents[b.Node].Runtime
		id := nodeagent.ContainerID(b)
		waitFor(t, fmt.Sprintf("rank %d's container to go", nodeagent.RankOf(b)), 30*time.Second, func() (bool, string) {
			_, err := rt.Status(context.Background(), id)
			return err != nil, fmt.Sprint(err)
		})
		waitFor(t, fmt.Sprintf("rank %d's binding to be released", nodeagent.RankOf(b)), 30*time.Second, func() (bool, string) {
			r, err := cli.Get(context.Background(), keys.Binding(b.Node, "mn-long"), clientv3.WithCountOnly())
			return err == nil && r.Count == 0, fmt.Sprint(err)
		})
	}
}

// TestJobMeshLikeNCCL: a 3-part job whose ranks meet as NCCL's and Gloo's
// do: each listens on a port the kernel chose and advertises its
// container's own address (the image's rendezvous stand-in with -mesh
// ephemeral). With the parts' mesh (VOYAGER_AGENT_JOB_ROUTES direct) every
// rank reaches every other there; another owner's sessions on the job's
// machines reach none of those endpoints. With the mesh off, the same job
// fails: its ranks cannot reach each other (what the mesh is for).
func TestJobMeshLikeNCCL(t *testing.T) {
	cli := etcdtest.New(t)
	ms := machines(t, 3)
	const first, last = 46200, 46399
	agents := machineAgents(t, cli, ms, "mesh", first, last)
	logOf := partLogs(agents)
	job := state.Session{ID: "mesh-nccl", Owner: "ada", Kind: state.KindBatch, Nodes: 3, OnPartFailure: state.PartFailureStopAll,
		Command: []string{"rendezvous", "-mesh", "ephemeral", "-serve", "-timeout", "60s"}}
	parts := bindParts(t, cli, job, mnParts(ms, first))
	waitPhase(t, cli, job.ID, state.PhaseRunning, 90*time.Second)
	var endpoints []string
	for _, b := range parts {
		r := nodeagent.RankOf(b)
		var out string
		waitFor(t, fmt.Sprintf("rank %d to reach every other rank", r), 60*time.Second, func() (bool, string) {
			out = logOf(b)
			return strings.Contains(out, fmt.Sprintf("rank %d serves its mesh endpoint", r)), out
		})
		var ep string
		for _, line := range strings.Split(out, "\n") {
			if rest, ok := strings.CutPrefix(line, fmt.Sprintf("rendezvous: rank %d advertises ", r)); ok {
				ep = strings.TrimSpace(rest)
			}
		}
		host, _, err := net.SplitHostPort(ep)
		if err != nil || host == ms[r].addr {
			t.Fatalf("rank %d advertised %q, want its container's own address:\n%s", r, ep, out)
		}
		// The part reported that address before its process started.
		p, _, err := state.Get[state.PartStatus](context.Background(), cli, keys.Part(b.Node, job.ID))
		if err != nil || p.Address != host {
			t.Errorf("rank %d's part reports address %q (%v), want %s", r, p.Address, err, host)
		}
		endpoints = append(endpoints, ep)
	}
	t.Logf("the ranks advertised %v", endpoints)

	// eve, on each of the job's machines: the world outside answers; no
	// rank's endpoint does (not her machine's rank across the bridge, not
	// the others' though her machine routes to their subnets).
	probeFromOthers(t, cli, ms, "mesh-eve", outsideServer(t, ms[0]), endpoints, logOf)

	// Without the mesh (other agents on the same machines, as other nodes):
	// the same job fails, its ranks reaching no other.
	off := make([]machine, 2)
	for i := range off {
		off[i] = ms[i]
		off[i].name += "-off"
	}
	offAgents := machineAgents(t, cli, off, "meshoff", first+200, last+200, func(c *nodeagent.Config) { c.JobRoutes = nodeagent.JobRoutesOff })
	two := state.Session{ID: "mesh-off", Owner: "ada", Kind: state.KindBatch, Nodes: 2, OnPartFailure: state.PartFailureStopAll,
		Command: []string{"rendezvous", "-mesh", "ephemeral", "-timeout", "15s"}}
	offParts := bindParts(t, cli, two, []state.Binding{
		{Node: off[0].name, Role: state.RoleHead, CPUMilli: 200, MemoryMiB: 128, Ports: mnPorts(first+200, true)},
		{Node: off[1].name, Role: state.RoleWorker, Worker: 1, HeadNode: off[0].name, CPUMilli: 200, MemoryMiB: 128, Ports: mnPorts(first+220, false)},
	})
	st := waitPhase(t, cli, two.ID, state.PhaseFailed, 90*time.Second)
	if st.ExitCode == nil || *st.ExitCode != 1 {
		t.Errorf("job without the mesh: exit code %v, want the stand-in's 1", st.ExitCode)
	}
	// The first rank to give up fails the job, and the other is stopped
	// before it may say so: one of them says why.
	offLog := partLogs(offAgents)
	var said string
	waitFor(t, "a rank's log to say why", logCopied, func() (bool, string) {
		said = offLog(offParts[0]) + offLog(offParts[1])
		return strings.Contains(said, "reach the other ranks"), said
	})
	t.Logf("without the mesh, the ranks said:\n%s", said)
}

// probeFromOthers runs, as another owner (eve), a batch session on each of
// ms that fetches outside (which must answer: the probe works) and each of
// targets (none may answer), and fails t if one did.
func probeFromOthers(t *testing.T, cli *clientv3.Client, ms []machine, prefix, outside string, targets []string, logOf func(state.Binding) string) {
	t.Helper()
	probe := fmt.Sprintf("if timeout 3 wget -q -O - http://%s/ >/dev/null 2>&1; then echo OUTSIDE REACHED; fi; ", outside)
	for _, target := range targets {
		probe += fmt.Sprintf("if timeout 3 wget -q -O - http://%s/ >/dev/null 2>&1; then echo REACHED %s; else echo REFUSED %s; fi; ", target, target, target)
	}
	probe += "echo PROBED"
	for i, m := range ms {
		id := fmt.Sprintf("%s-%d", prefix, i)
		eve := bindParts(t, cli, state.Session{ID: id, Owner: "eve", Kind: state.KindBatch, Command: []string{"sh", "-c", probe}},
			[]state.Binding{{Node: m.name, Role: state.RoleSingle, CPUMilli: 100, MemoryMiB: 64}})
		waitPhase(t, cli, id, state.PhaseSucceeded, 60*time.Second)
		var out string
		waitFor(t, "eve's probe to report", logCopied, func() (bool, string) {
			out = logOf(eve[0])
			return strings.Contains(out, "PROBED"), out
		})
		if !strings.Contains(out, "OUTSIDE REACHED") || strings.Contains(out, "\nREACHED") || strings.HasPrefix(out, "REACHED") || strings.Count(out, "REFUSED") != len(targets) {
			t.Errorf("another owner's session on %s reached the job:\n%s", m.name, out)
		}
	}
}

// logCopied bounds the wait for a part's log to hold what its process
// wrote before it exited; the wait ends as soon as it does. The shim copies
// the output a moment after the exit, and a wait of 10 s ran out once
// (TestJobMeshLikeNCCL, its mesh-off half) under make test's full load on
// two cores, while this package's agents renewed their leases 6 s late.
const logCopied = 60 * time.Second

// partLogs reads a part's log from the agent of its machine.
func partLogs(agents map[string]nodeagent.Config) func(state.Binding) string {
	return func(b state.Binding) string {
		out, _ := os.ReadFile(filepath.Join(agents[b.Node].LogDir, nodeagent.ContainerID(b)+".log"))
		return string(out)
	}
}
