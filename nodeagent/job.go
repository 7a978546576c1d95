package nodeagent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// HostfilePath is where every part of a multi-node job finds the job's
// hostfile (VOYAGER_HOSTFILE): one line per rank, in rank order, in the
// format DeepSpeed's and Open MPI's launchers read: "ADDRESS slots=N",
// N the part's GPUs (1 for a CPU-only part).
const HostfilePath = "/etc/voyager/hostfile"

// JobPart is one part (rank) of a multi-node job as every part sees it:
// its node's address, its GPUs and its ports.
type JobPart struct {
	Rank    int
	Node    string
	Address string
	// Subnet is the node's container subnet ("" on the host's network).
	Subnet string
	GPUs   int
	Ports  Ports
	// attempt and queueRevision name the part's binding (its part status
	// copies them).
	attempt       int
	queueRevision int64
}

// slots is how many processes a launcher starts on the part: one per GPU,
// one for a CPU-only part.
func (p JobPart) slots() int { return max(p.GPUs, 1) }

// RankOf is the rank of binding b in its multi-node job: 0 for the head
// part, the worker index for the others.
func RankOf(b state.Binding) int {
	if b.Role == state.RoleWorker {
		return b.Worker
	}
	return 0
}

// PartPorts names the ports of a binding of session s: a multi-node job's
// part has MASTER_PORT first (rank 0 only) and then its peer ports; any
// other session's are split by SplitPorts.
func PartPorts(s state.Session, role state.Role, ports []int) (Ports, error) {
	if !s.Gang() || role == state.RoleSingle {
		return SplitPorts(s.Kind, role, ports)
	}
	need := state.QueueEntry{Kind: s.Kind, Nodes: s.Nodes}.Ports(role)
	if len(ports) < need {
		return Ports{}, fmt.Errorf("split ports: a %s of a multi-node job needs %d ports, the binding has %d", role, need, len(ports))
	}
	var p Ports
	if role == state.RoleHead {
		p.Master, ports = ports[0], ports[1:]
	}
	p.Peer = append([]int(nil), ports[:state.JobPeerPorts]...)
	return p, nil
}

// JobEnv is the environment of rank's part of a multi-node job of parts
// (in rank order): what torchrun (also through its PET_ variables, so that
// a bare `torchrun train.py` joins the job), DeepSpeed, Horovod and mpirun
// read. WORLD_SIZE is the number of parts (machines): torchrun sets
// RANK, LOCAL_RANK and WORLD_SIZE of every process it starts itself.
func JobEnv(parts []JobPart, rank int) map[string]string {
	head, me := parts[0], parts[rank]
	n := strconv.Itoa(len(parts))
	peer := make([]string, len(me.Ports.Peer))
	for i, p := range me.Ports.Peer {
		peer[i] = strconv.Itoa(p)
	}
	r, nproc := strconv.Itoa(rank), strconv.Itoa(me.slots())
	return map[string]string{
		"MASTER_ADDR":           head.Address,
		"MASTER_PORT":           strconv.Itoa(head.Ports.Master),
		"WORLD_SIZE":            n,
		"NODE_RANK":             r,
		"GROUP_RANK":            r,
		"NNODES":                n,
		"NPROC_PER_NODE":        nproc,
		"PET_NNODES":            n,
		"PET_NODE_RANK":         r,
		"PET_NPROC_PER_NODE":    nproc,
		"PET_MASTER_ADDR":       head.Address,
		"PET_MASTER_PORT":       strconv.Itoa(head.Ports.Master),
		"VOYAGER_NODES":         n,
		"VOYAGER_NODE_RANK":     r,
		"VOYAGER_NODE_ADDR":     me.Address,
		"VOYAGER_GPUS_PER_NODE": strconv.Itoa(me.GPUs),
		"VOYAGER_PEER_PORTS":    strings.Join(peer, ","),
		"VOYAGER_HOSTFILE":      HostfilePath,
	}
}

// Hostfile is the job's hostfile (HostfilePath) for parts in rank order.
func Hostfile(parts []JobPart) string {
	var b strings.Builder
	for _, p := range parts {
		fmt.Fprintf(&b, "%s slots=%d\n", p.Address, p.slots())
	}
	return b.String()
}

// jobParts reads every part of the worker's multi-node job, in rank order:
// the nodes in the session's status, their bindings and node records.
func (w *worker) jobParts(ctx context.Context, sess state.Session) ([]JobPart, error) {
	cfg := w.a.cfg
	id := w.item.Value.Session
	st, _, err := state.Get[state.Status](ctx, cfg.Client, cfg.Keys.Status(id))
	if err != nil {
		return nil, fmt.Errorf("find the parts of job %s: %w", id, err)
	}
	parts := make([]JobPart, len(st.Nodes))
	seen := make([]bool, len(st.Nodes))
	bs, ns, err := w.a.bindingsAndNodes(ctx, id, st.Nodes)
	if err != nil {
		return nil, fmt.Errorf("find the parts of job %s: %w", id, err)
	}
	for i, n := range st.Nodes {
		b, node := bs[i], ns[i]
		if b == nil {
			return nil, fmt.Errorf("find the parts of job %s: the binding on %s: %w", id, n, state.ErrNotFound)
		}
		if node == nil {
			return nil, fmt.Errorf("find the parts of job %s: node %s: %w", id, n, state.ErrNotFound)
		}
		p, err := PartPorts(sess, b.Role, b.Ports)
		if err != nil {
			return nil, fmt.Errorf("find the parts of job %s: %w", id, err)
		}
		r := RankOf(*b)
		if r < 0 || r >= len(parts) || seen[r] {
			return nil, fmt.Errorf("find the parts of job %s: the binding on %s has rank %d, want each of 0 to %d once", id, n, r, len(parts)-1)
		}
		seen[r] = true
		parts[r] = JobPart{Rank: r, Node: n, Address: node.Address, Subnet: node.Subnet, GPUs: len(b.GPUs), Ports: p,
			attempt: b.Attempt, queueRevision: b.QueueRevision}
	}
	if want := sess.JobNodes(st); len(parts) != want {
		return nil, fmt.Errorf("find the parts of job %s: its status names %d nodes, the job has %d", id, len(parts), want)
	}
	return parts, nil
}

// jobPeers are the parts of a job other than the one on this node, as
// the part's network rules see them.
func jobPeers(parts []JobPart, self string) []Peer {
	var out []Peer
	for _, p := range parts {
		if p.Node != self {
			out = append(out, Peer{Address: p.Address, Ports: p.Ports})
		}
	}
	return out
}

// hostfilePath is where the agent keeps the hostfile of container id: next
// to its log, removed with the container.
func (a *Agent) hostfilePath(id string) string {
	if a.cfg.LogDir == "" {
		return ""
	}
	return filepath.Join(a.cfg.LogDir, id+".hostfile")
}

// withJob adds what a multi-node job's part needs to spec: the job's
// environment and its hostfile, mounted read-only at HostfilePath. It
// returns the part's peers.
func (w *worker) withJob(ctx context.Context, sess state.Session, spec *runtime.Spec) ([]Peer, error) {
	parts, err := w.jobParts(ctx, sess)
	if err != nil {
		return nil, err
	}
	for k, v := range JobEnv(parts, RankOf(w.item.Value)) {
		spec.Env[k] = v
	}
	if spec.Mesh = w.mesh(parts, w.stopReq); spec.Mesh != nil {
		// NCCL and Gloo advertise the address of the interface they
		// bind: the container's own, which the other parts reach.
		for _, k := range []string{"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"} {
			if spec.Env[k] == "" {
				spec.Env[k] = "eth0"
			}
		}
	}
	if path := w.a.hostfilePath(w.id); path != "" {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("write hostfile: %w", err)
		}
		if err := os.WriteFile(path, []byte(Hostfile(parts)), 0o644); err != nil {
			return nil, fmt.Errorf("write hostfile: %w", err)
		}
		spec.Mounts = append(spec.Mounts, runtime.Mount{Source: path, Target: HostfilePath, ReadOnly: true})
	}
	return jobPeers(parts, w.a.cfg.Node), nil
}
