package nodeagent

import (
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// HomePath is where a session's home directory is mounted.
const HomePath = "/home/jovyan"

// jupyterToken is the Jupyter token of container id: an HMAC of the id
// under the agent's secret (kept in its log directory), so that an agent
// that adopts the container after a restart knows it again without
// keeping it anywhere a tenant could read it (it is in the container's
// environment only, never in a label or argv). Without a log directory it
// is random.
func (a *Agent) jupyterToken(id string) (string, error) {
	secret, err := a.logSecret()
	if err != nil {
		return newToken()
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("jupyter-token\x00" + id))
	return hex.EncodeToString(m.Sum(nil))[:48], nil
}

// newToken returns a random Jupyter token: 24 bytes, hex.
func newToken() (string, error) {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("make token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// ContainerSpec builds the container of binding b of session s with
// command args. token is the notebook's Jupyter token (empty for others).
func (a *Agent) ContainerSpec(s state.Session, b state.Binding, args []string, token string) (runtime.Spec, error) {
	cfg := a.cfg
	id := ContainerID(b)
	ports := make([]string, len(b.Ports))
	for i, p := range b.Ports {
		ports[i] = strconv.Itoa(p)
	}
	env := map[string]string{
		"HOME":            HomePath,
		"USER":            "jovyan",
		"VOYAGER_SESSION": s.ID,
		"VOYAGER_OWNER":   s.Owner,
		"VOYAGER_ROLE":    string(b.Role),
		"VOYAGER_PORTS":   strings.Join(ports, ","),
		// How many times the session was restarted (OnFailure) before
		// this run, as torchrun's TORCHELASTIC_RESTART_COUNT: training
		// code resumes from its checkpoint when it is above 0. Every part
		// of a multi-node job, restarted as a whole, sees the same.
		"VOYAGER_ATTEMPT": strconv.Itoa(b.Attempt),
	}
	if len(b.Ports) > 0 {
		env["PORT"] = ports[0]
	}
	if token != "" {
		env["JUPYTER_TOKEN"] = token
	}
	for k, v := range s.Env {
		env[k] = v
	}
	for k, v := range elasticEnv(s, b) { // Voyager's own over the session's
		env[k] = v
	}
	spec := runtime.Spec{
		ID:          id,
		Image:       s.Image,
		Args:        args,
		Env:         env,
		WorkDir:     HomePath,
		UID:         cmp.Or(s.UID, cfg.UID), // the owner's own; the agent's for sessions without one
		GID:         cfg.GID,
		CPUMilli:    b.CPUMilli,
		MemoryBytes: b.MemoryMiB << 20,
		PidsLimit:   cfg.PidsLimit,
		ShmBytes:    cfg.ShmMiB << 20,
		Labels: map[string]string{
			LabelNode:     cfg.Node,
			LabelSession:  s.ID,
			LabelOwner:    s.Owner,
			LabelRole:     string(b.Role),
			LabelKind:     string(s.Kind),
			LabelQueueRev: strconv.FormatInt(b.QueueRevision, 10),
		},
	}
	if e := s.Egress; e != nil && e.Deny {
		spec.DenyEgress, spec.EgressAllow = true, slices.Clone(e.Allow)
	}
	if spec.Image == "" {
		spec.Image = cfg.Image
	}
	if spec.Image == "" {
		return runtime.Spec{}, fmt.Errorf("build container of %s: the session names no image and the agent has no default", s.ID)
	}
	if b.MemoryMiB > 0 && b.MemoryMiB < cfg.ShmMiB {
		spec.ShmBytes = b.MemoryMiB << 20
	}
	if s.ShmMiB > 0 { // admission bounded it by the session's memory
		spec.ShmBytes = s.ShmMiB << 20
	}
	if u := s.Ulimits; u != nil {
		spec.Rlimits = ulimits(*u)
	}
	if cfg.LogDir != "" {
		spec.LogPath = filepath.Join(cfg.LogDir, id+".log")
	}
	if cfg.HomeDir != "" {
		if err := state.ValidateSubject("owner", s.Owner); err != nil || strings.Trim(s.Owner, ".") == "" {
			return runtime.Spec{}, fmt.Errorf("build container of %s: owner %q cannot name a home directory", s.ID, s.Owner)
		}
		spec.Mounts = []runtime.Mount{{Source: filepath.Join(cfg.HomeDir, s.Owner), Target: HomePath, Create: true}}
	}
	for _, v := range s.Volumes {
		spec.Mounts = append(spec.Mounts, runtime.Mount{Source: v.HostPath, Target: v.MountPath, ReadOnly: v.ReadOnly, Create: v.PerUser, Private: v.PerUser})
	}
	if m, ok := a.reportsMount(s, id); ok {
		spec.Mounts = append(spec.Mounts, m)
		spec.Env["VOYAGER_GOODPUT_FILE"] = state.GoodputFile
	}
	if len(b.GPUs) > 0 && cfg.LogDir != "" {
		file, ncclFile, err := a.writeTopology(id, b.GPUs)
		if err != nil {
			return runtime.Spec{}, fmt.Errorf("build container of %s: %w", s.ID, err)
		}
		spec.Mounts = append(spec.Mounts, runtime.Mount{Source: file, Target: TopologyPath, ReadOnly: true})
		spec.Env["VOYAGER_GPU_TOPOLOGY"] = TopologyPath
		if ncclFile != "" {
			spec.Mounts = append(spec.Mounts, runtime.Mount{Source: ncclFile, Target: NCCLTopoPath, ReadOnly: true})
			if _, own := s.Env["NCCL_TOPO_FILE"]; !own { // the session's own file wins
				spec.Env["NCCL_TOPO_FILE"] = NCCLTopoPath
			}
		}
	}
	switch cfg.GPUMode {
	case GPUModeEnv:
		spec.Env["NVIDIA_VISIBLE_DEVICES"] = "void"
		if len(b.GPUs) > 0 {
			spec.Env["NVIDIA_VISIBLE_DEVICES"] = strings.Join(b.GPUs, ",")
		}
	default:
		for _, g := range b.GPUs {
			spec.CDIDevices = append(spec.CDIDevices, cfg.CDIKind+"="+g)
		}
	}
	if b.Share != nil {
		if err := a.shareSpec(&spec, b); err != nil {
			return runtime.Spec{}, fmt.Errorf("build container of %s: %w", s.ID, err)
		}
	}
	return spec, nil
}

// ulimits are a session's limits as the runtime's: soft and hard alike.
func ulimits(u state.Ulimits) []runtime.Rlimit {
	var out []runtime.Rlimit
	if u.MemlockKiB == state.UlimitUnlimited {
		out = append(out, runtime.Rlimit{Type: "RLIMIT_MEMLOCK", Soft: runtime.RlimitInfinity, Hard: runtime.RlimitInfinity})
	} else if u.MemlockKiB > 0 {
		out = append(out, runtime.Rlimit{Type: "RLIMIT_MEMLOCK", Soft: uint64(u.MemlockKiB) << 10, Hard: uint64(u.MemlockKiB) << 10})
	}
	if u.Nofile > 0 {
		out = append(out, runtime.Rlimit{Type: "RLIMIT_NOFILE", Soft: uint64(u.Nofile), Hard: uint64(u.Nofile)})
	}
	return out
}

// Peer is another part of the same session (a Ray head or worker, or a
// multi-node job's part, on another node): the node's address and the
// part's ports.
type Peer struct {
	Address string
	Ports   Ports
}

// gangPorts are the ports a part's peers connect to: the Ray head's GCS
// and client server, a Ray worker's node and object managers; a job's
// MASTER_PORT and peer ports. Never Jupyter's or the dashboard's.
func (p Ports) gangPorts() []int {
	var out []int
	for _, v := range append([]int{p.RayGCS, p.RayClient, p.NodeManager, p.ObjectManager, p.Master}, p.Peer...) {
		if v > 0 {
			out = append(out, v)
		}
	}
	return out
}

// NetworkRules says, for a part with its own network, which of its ports
// are published and to whom, and which endpoints it may reach that the
// node's port range would otherwise refuse: Jupyter is open to everyone
// (the token guards it); Ray's ports and a job's MASTER_PORT and peer
// ports only to the session's other parts' nodes, and a part reaches only
// its peers' such ports. The dashboard is
// never published (it listens on the container's loopback).
func NetworkRules(p Ports, peers []Peer) ([]runtime.Published, []runtime.Endpoint) {
	var pub []runtime.Published
	if p.Jupyter > 0 {
		pub = append(pub, runtime.Published{Port: p.Jupyter})
	}
	var from []string
	var reach []runtime.Endpoint
	for _, q := range peers {
		if !slices.Contains(from, q.Address) {
			from = append(from, q.Address)
		}
		if rp := q.Ports.gangPorts(); len(rp) > 0 {
			reach = append(reach, runtime.Endpoint{Addr: q.Address, Ports: rp})
		}
	}
	if rp := p.gangPorts(); len(rp) > 0 && len(from) > 0 {
		for _, port := range rp {
			pub = append(pub, runtime.Published{Port: port, From: from})
		}
	}
	return pub, reach
}
