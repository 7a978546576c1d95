package nodeagent_test

import (
	"reflect"
	"slices"
	"testing"

	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// TestJobPartsEnvironment: every part of a multi-node job is told rank 0's
// address and MASTER_PORT, the world size, its own rank, peer ports and
// GPUs (what torchrun, also through its PET_ variables, DeepSpeed and
// mpirun read), and the hostfile lists the parts in rank order.
func TestJobPartsEnvironment(t *testing.T) {
	job := state.Session{ID: "mn-env", Kind: state.KindBatch, Nodes: 3, Command: []string{"torchrun", "train.py"}}
	head, err := nodeagent.PartPorts(job, state.RoleHead, []int{31000, 31001, 31002, 31003, 31004, 31005, 31006, 31007, 31008})
	if err != nil {
		t.Fatal(err)
	}
	if head.Master != 31000 || !slices.Equal(head.Peer, []int{31001, 31002, 31003, 31004, 31005, 31006, 31007, 31008}) {
		t.Errorf("rank 0's ports %+v: want MASTER_PORT 31000, then 8 peer ports", head)
	}
	if _, err := nodeagent.PartPorts(job, state.RoleWorker, []int{31010, 31011}); err == nil {
		t.Error("a worker part with 2 ports was accepted; it needs JobPeerPorts")
	}
	w1, _ := nodeagent.PartPorts(job, state.RoleWorker, []int{31010, 31011, 31012, 31013, 31014, 31015, 31016, 31017})
	w2, _ := nodeagent.PartPorts(job, state.RoleWorker, []int{31020, 31021, 31022, 31023, 31024, 31025, 31026, 31027})
	parts := []nodeagent.JobPart{
		{Rank: 0, Node: "a", Address: "10.0.0.1", GPUs: 8, Ports: head},
		{Rank: 1, Node: "b", Address: "10.0.0.2", GPUs: 8, Ports: w1},
		{Rank: 2, Node: "c", Address: "10.0.0.3", GPUs: 0, Ports: w2},
	}
	env := nodeagent.JobEnv(parts, 2)
	for k, v := range map[string]string{
		"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "31000", "WORLD_SIZE": "3", "NODE_RANK": "2", "GROUP_RANK": "2",
		"NPROC_PER_NODE": "1", "VOYAGER_GPUS_PER_NODE": "0", "VOYAGER_NODE_ADDR": "10.0.0.3",
		"PET_NNODES": "3", "PET_NODE_RANK": "2", "PET_MASTER_ADDR": "10.0.0.1", "PET_MASTER_PORT": "31000", "PET_NPROC_PER_NODE": "1",
		"VOYAGER_PEER_PORTS": "31020,31021,31022,31023,31024,31025,31026,31027", "VOYAGER_HOSTFILE": nodeagent.HostfilePath,
	} {
		if env[k] != v {
			t.Errorf("rank 2's %s=%q, want %q", k, env[k], v)
		}
	}
	if got := nodeagent.Hostfile(parts); got != "10.0.0.1 slots=8\n10.0.0.2 slots=8\n10.0.0.3 slots=1\n" {
		t.Errorf("hostfile %q", got)
	}

	// Rank 0 publishes MASTER_PORT and its peer ports to the other parts'
	// nodes only, and may reach their peer ports.
	pub, reach := nodeagent.NetworkRules(head, []nodeagent.Peer{{Address: "10.0.0.2", Ports: w1}, {Address: "10.0.0.3", Ports: w2}})
	if len(pub) != 9 {
		t.Fatalf("rank 0 publishes %d ports, want 9: %+v", len(pub), pub)
	}
	for _, p := range pub {
		if !reflect.DeepEqual(p.From, []string{"10.0.0.2", "10.0.0.3"}) {
			t.Errorf("port %d published to %v, want the other parts' nodes only", p.Port, p.From)
		}
	}
	if want := []runtime.Endpoint{{Addr: "10.0.0.2", Ports: w1.Peer}, {Addr: "10.0.0.3", Ports: w2.Peer}}; !reflect.DeepEqual(reach, want) {
		t.Errorf("rank 0 reaches %+v, want %+v", reach, want)
	}

	// Every part runs the job's own command, never Ray's.
	for _, b := range []state.Binding{{Role: state.RoleHead, Ports: []int{1}}, {Role: state.RoleWorker, Worker: 1}} {
		args, err := nodeagent.Command(job, b, nodeagent.Head{})
		if err != nil || !slices.Equal(args, job.Command) {
			t.Errorf("%s's command %q (%v), want the job's %q", b.Role, args, err, job.Command)
		}
	}
}
