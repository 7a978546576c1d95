package state

import (
	"encoding/json"
	"fmt"
	"sort"
	"time"
)

// SessionKind says what a session runs.
type SessionKind string

// Session kinds.
const (
	// KindNotebook runs a Jupyter server (and a Ray head when Ray is set)
	// until it is stopped.
	KindNotebook SessionKind = "notebook"
	// KindBatch runs a command to completion; its exit code is its result.
	KindBatch SessionKind = "batch"
)

// DesiredState is what the session's owner wants: the API writes it, the
// placer and agents converge to it.
type DesiredState string

// Desired states.
const (
	DesiredRunning DesiredState = "running"
	DesiredStopped DesiredState = "stopped"
)

// Phase is where a session is in its life. See docs/state.md for the graph.
type Phase string

// Session phases.
const (
	PhasePending   Phase = "Pending"   // queued; Status.Reason says why it waits
	PhaseBound     Phase = "Bound"     // GPUs chosen, bindings written; no container yet
	PhaseStarting  Phase = "Starting"  // the agent is pulling or creating containers
	PhaseRunning   Phase = "Running"   // serving (notebook) or executing (batch)
	PhaseSucceeded Phase = "Succeeded" // batch exited 0
	PhaseFailed    Phase = "Failed"    // batch exited non-zero, or could not start
	PhaseStopping  Phase = "Stopping"  // stop requested; containers terminating
	PhaseStopped   Phase = "Stopped"   // stopped on request, or cancelled while pending
	PhaseLost      Phase = "Lost"      // its node's lease expired and it was not re-queued
)

// Terminal reports whether a session in phase p will never run again. A
// session re-queued after its node was lost is Pending again, not Lost.
func (p Phase) Terminal() bool {
	switch p {
	case PhaseSucceeded, PhaseFailed, PhaseStopped, PhaseLost:
		return true
	}
	return false
}

// Role is the part a node plays in a session.
type Role string

// Binding roles.
const (
	RoleSingle Role = "single" // a session on one node
	RoleHead   Role = "head"   // the Ray head (and Jupyter) of a multi-node session, or rank 0 of a multi-node job
	RoleWorker Role = "worker" // a Ray worker that joins the head, or rank Binding.Worker of a multi-node job
)

// Duration is a time.Duration that reads and writes JSON as a Go duration
// string ("90m", "1h30m0s"), so values stay readable in etcdctl output.
type Duration time.Duration

// MarshalJSON writes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON reads a duration string such as "2h" or "90s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("parse duration: want a string such as \"90m\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("parse duration %q: want a Go duration such as \"90m\" or \"2h\": %w", s, err)
	}
	*d = Duration(v)
	return nil
}

// Std returns d as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// Resources is what one node must provide for one part of a session.
type Resources struct {
	// GPUs is the number of whole GPUs (or MIG devices when MIGProfile is
	// set). Zero is a CPU-only session.
	GPUs int `json:"gpus"`
	// GPUModel is a shell pattern (path.Match) over the GPU model name,
	// for example "*A100*". Empty accepts any model.
	GPUModel string `json:"gpuModel,omitempty"`
	// GPUMemoryMiB is the least memory each GPU must have.
	GPUMemoryMiB int64 `json:"gpuMemoryMiB,omitempty"`
	// MIGProfile asks for MIG devices of this profile, e.g. "1g.10gb",
	// instead of whole GPUs.
	MIGProfile string `json:"migProfile,omitempty"`
	// GPUShareMiB asks for a fraction of one shared GPU (GPU.Shared)
	// instead of whole GPUs: this much of its memory, enforced on the
	// node (share.go). GPUs is then 1.
	GPUShareMiB int64 `json:"gpuShareMiB,omitempty"`
	// GPUComputePercent is the fraction's share of the GPU's compute
	// (1-100; 0: no cap of its own), with GPUShareMiB only.
	GPUComputePercent int `json:"gpuComputePercent,omitempty"`
	// CPUMilli is CPU in thousandths of a core.
	CPUMilli int64 `json:"cpuMilli"`
	// MemoryMiB is host memory in MiB.
	MemoryMiB int64 `json:"memoryMiB"`
	// NodeSelector must all be present, with equal values, in the node's labels.
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
}

// Ray asks for a Ray cluster: a head on the session's node and Workers more
// nodes that join it. The whole session is bound all-or-nothing.
type Ray struct {
	// Workers is the number of additional nodes, one worker each.
	Workers int `json:"workers"`
	// WorkerResources is each worker's request; nil means the same as the head.
	WorkerResources *Resources `json:"workerResources,omitempty"`
}

// Limits bound a session's life.
type Limits struct {
	// MaxRuntime stops the session this long after it started. Zero: no limit.
	MaxRuntime Duration `json:"maxRuntime,omitempty"`
	// IdleTimeout stops a notebook idle this long. Zero: the cluster default.
	IdleTimeout Duration `json:"idleTimeout,omitempty"`
}

// RestartPolicy says what happens when a batch session fails or its node is lost.
type RestartPolicy struct {
	// Policy is "Never" (the default) or "OnFailure".
	Policy string `json:"policy,omitempty"`
	// MaxRestarts bounds OnFailure restarts.
	MaxRestarts int `json:"maxRestarts,omitempty"`
	// Backoff is the delay before the first restart; it doubles each time.
	Backoff Duration `json:"backoff,omitempty"`
}

// What a multi-node job does when one part fails (Session.OnPartFailure).
const (
	PartFailureStopAll  = "StopAll"
	PartFailureContinue = "Continue"
)

// Egress limits where a session's containers may open connections.
type Egress struct {
	// Deny refuses every connection the session opens but those to
	// Allow's networks, to its own gang's parts, and to the endpoints the
	// node's operator opens to every session (VOYAGER_AGENT_NETWORK_ALLOW,
	// e.g. JupyterHub's API). Replies to connections made to the session
	// (a browser on Jupyter) still flow.
	Deny bool `json:"deny,omitempty"`
	// Allow lists the IPv4 networks ("10.20.0.0/16", "192.0.2.7/32") a
	// denied session still reaches: a package mirror, a dataset store,
	// its DNS server.
	Allow []string `json:"allow,omitempty"`
}

// Restart policies.
const (
	RestartNever     = "Never"
	RestartOnFailure = "OnFailure"
)

// Session is the spec of one session, stored at sessions/<id>. The API
// writes it on create; afterwards the API changes Desired (stop) and
// Limits.MaxRuntime (an owner's extension), and the lifecycle controller
// sets Eviction, and clears it when it re-queues the session.
type Session struct {
	ID    string `json:"id"`
	Owner string `json:"owner"`
	// UID is the user id the session's containers run as: the owner's
	// own (EnsureUID), so homes are protected by file permissions. Nil in
	// sessions from before per-owner ids: the agent's default.
	UID    *uint32  `json:"uid,omitempty"`
	Groups []string `json:"groups,omitempty"`
	// Team is the team the session is charged to (teams/<name>), chosen
	// at admission from the owner's teams; empty where no team exists.
	Team    string      `json:"team,omitempty"`
	Name    string      `json:"name,omitempty"` // a label, e.g. a JupyterHub server name
	Kind    SessionKind `json:"kind"`
	Profile string      `json:"profile,omitempty"`

	Resources Resources `json:"resources"`
	Ray       *Ray      `json:"ray,omitempty"`
	// Nodes is how many machines a batch job runs on, one part on each,
	// every part with Resources: rank 0 is the head part, ranks 1 to
	// Nodes-1 its workers, bound all-or-nothing like a Ray gang. Zero or
	// one is a job on one machine.
	Nodes int `json:"nodes,omitempty"`
	// Elastic, when set, lets a batch job on one machine run at any size
	// from Elastic.Min to Elastic.Max GPUs, or a multi-node job (Nodes is
	// then Elastic.MaxNodes) on Elastic.MinNodes to MaxNodes machines
	// (elastic.go).
	Elastic *Elastic `json:"elastic,omitempty"`
	// OnPartFailure is what a multi-node job does when one part fails:
	// PartFailureStopAll (the default) ends the job with that part's exit
	// code and stops the other parts; PartFailureContinue lets them run,
	// and the job ends when rank 0 has ended.
	OnPartFailure string `json:"onPartFailure,omitempty"`

	Image   string            `json:"image,omitempty"`
	Command []string          `json:"command,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// SecretEnv is set when the values of Env (all but VOYAGER_*) are
	// held empty here and kept in specsecrets/<id> (SpecSecrets), which
	// the operator and other nodes' agents cannot read.
	SecretEnv bool `json:"secretEnv,omitempty"`
	// Egress, when set, limits the connections the session's containers
	// open (from its profile, or asked by the owner). Nil: they reach
	// the world outside the node.
	Egress *Egress `json:"egress,omitempty"`
	// ShmMiB sizes the containers' /dev/shm, a tmpfs whose pages count
	// against the session's memory. Zero (sessions from before it): the
	// agent's default.
	ShmMiB int64 `json:"shmMiB,omitempty"`
	// Ulimits are the containers' memlock and open-file limits; nil
	// (sessions from before them): the runtime's defaults.
	Ulimits *Ulimits `json:"ulimits,omitempty"`
	// Volumes are the operator's volumes mounted into the containers, as
	// the API resolved them at admission.
	Volumes []VolumeMount `json:"volumes,omitempty"`

	Limits      Limits        `json:"limits"`
	Priority    int           `json:"priority"`
	Preemptible bool          `json:"preemptible,omitempty"`
	Restart     RestartPolicy `json:"restart"`

	Desired DesiredState `json:"desired"`
	// Eviction, when set, is the system's decision to stop the session
	// (idle, max runtime, drain, preemption): its agent stops the
	// containers as for a stop and writes the eviction's reason into the
	// final status.
	Eviction *Eviction `json:"eviction,omitempty"`
	Created  time.Time `json:"created"`
	// Array, when set, names the job array this session is an element
	// of (arrays/<id>) and its index.
	Array *ArrayMember `json:"array,omitempty"`
}

// Stopping reports whether the session's agents should stop it: its owner
// asked, or the lifecycle controller evicted it.
func (s Session) Stopping() bool { return s.Desired == DesiredStopped || s.Eviction != nil }

// Warning and eviction reasons: why the system stops a session.
const (
	ReasonIdle       = "IdleTimeout" // no activity past the idle timeout
	ReasonMaxRuntime = "MaxRuntime"  // ran past its max runtime
	ReasonDrained    = "NodeDrained" // its node is drained and the deadline passed
	ReasonPreempted  = "Preempted"   // a higher-priority session needs its GPUs
	ReasonBackOff    = "BackOff"     // failed; waits to restart (OnFailure)
	// ReasonFenced: the attempt's containers were stopped by a fence (the
	// agent could not renew its node lease in time, or its fence keeper
	// acted for it) or are gone after it had launched them. The attempt
	// ended there and is never started again in place: the session waits
	// to be re-queued as the next attempt (restarts left), else is Lost.
	ReasonFenced = "Fenced"
)

// Eviction is the lifecycle controller's decision to stop a running
// session, written into its spec once a warning's deadline passed.
type Eviction struct {
	// Reason is one of IdleTimeout, MaxRuntime, NodeDrained, Preempted.
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	At      time.Time `json:"at"`
	// Requeue puts the session back in the queue once its containers
	// stopped, instead of ending it (preemption).
	Requeue bool `json:"requeue,omitempty"`
	// By is the session that preempted this one.
	By string `json:"by,omitempty"`
}

// Warning tells a session's owner that the system will stop the session,
// why, and when: stored at warnings/<id> by the lifecycle controller. It is
// deleted when its cause goes away (activity resumed, runtime extended,
// node uncordoned) and when the session ends. The API streams it as a
// "warning" event.
type Warning struct {
	Session string `json:"session"`
	// Reason is one of IdleTimeout, MaxRuntime, NodeDrained, Preempted.
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	Issued  time.Time `json:"issued"`
	// StopAt is when the session will be stopped unless the cause goes away.
	StopAt time.Time `json:"stopAt"`
	// Node is the node being drained, or the node whose GPUs the
	// preempting session will take.
	Node string `json:"node,omitempty"`
	// By is the session that preempts this one.
	By string `json:"by,omitempty"`
	// Why is a preemption's cause in a few words, which the eviction's
	// message repeats ("team vision reclaims its fair share …"); empty
	// for a preemption by priority.
	Why string `json:"why,omitempty"`
	// Reclaim is, for a preemption by which a team below its guarantee or
	// its fair share takes back GPUs the victim's team holds beyond its
	// own (placer/reclaim.go), the preempting session's team; empty for a
	// preemption by priority.
	Reclaim string `json:"reclaim,omitempty"`
	// Size is the size a resize (Reason Resized) restarts the job at.
	Size int `json:"size,omitempty"`
}

// Secrets are what a session's agent publishes that only the session's
// owner may use, stored at secrets/<node>/<id>, apart from the status that
// operators read: the URLs with their token or key (Jupyter's ?token=, the
// log endpoint's ?key=). The API joins them into its owner's view.
type Secrets struct {
	Session string `json:"session"`
	Node    string `json:"node"`
	// URLs are the status URLs (same names) with their secret parts.
	URLs map[string]string `json:"urls"`
}

// QueueEntry is a pending session's place in the queue, stored at
// pending/<id>. It carries everything the placer needs, so the placer never
// reads the spec.
type QueueEntry struct {
	Session       string      `json:"session"`
	Kind          SessionKind `json:"kind"`
	Owner         string      `json:"owner"`
	Groups        []string    `json:"groups,omitempty"`
	Team          string      `json:"team,omitempty"` // Session.Team
	Priority      int         `json:"priority"`
	Preemptible   bool        `json:"preemptible,omitempty"`
	Created       time.Time   `json:"created"`  // first submission: the age that orders the queue
	Enqueued      time.Time   `json:"enqueued"` // this (re)queueing
	Attempt       int         `json:"attempt"`  // 0 at first; +1 each re-queue after Lost
	Request       Resources   `json:"request"`
	Workers       int         `json:"workers,omitempty"`
	WorkerRequest *Resources  `json:"workerRequest,omitempty"`
	// Nodes is set (above 1) for a multi-node batch job (Session.Nodes):
	// its Workers are the job's ranks 1 to Nodes-1, not Ray workers, and
	// its parts need the job's ports, not Ray's (Ports).
	Nodes int `json:"nodes,omitempty"`
	// Elastic is Session.Elastic: the placer binds the job at a size from
	// Min to Cap() (placer/elastic.go), not at Request.GPUs; a range of
	// machines at MinNodes to NodeCap() parts (Workers is NodeCap()-1;
	// placer/elastic_nodes.go).
	Elastic *Elastic `json:"elastic,omitempty"`
	// MaxRuntime is the session's max runtime (Limits.MaxRuntime) when it
	// was queued; zero: none. The placer lets a session with one run on a
	// node held for a large request when it ends before the node drains
	// (backfill, placer/hold.go).
	MaxRuntime Duration `json:"maxRuntime,omitempty"`
	// Secrets is set when the session has a secrets record
	// (specsecrets/<id>) that its bind must hand to its nodes.
	Secrets bool `json:"secrets,omitempty"`
	// Hold is the node that a preemption for this session frees, written
	// with its victims' warnings: the placers keep the node's room for
	// it until it binds, through its victims' stop and after their
	// warnings are gone, or until Hold.Until (placer/preempthold.go).
	Hold *QueueHold `json:"hold,omitempty"`
}

// QueueHold is a node whose room is kept for a waiting session whose
// preemption freed it (QueueEntry.Hold).
type QueueHold struct {
	Node string `json:"node"`
	// Until is when the hold lapses if the session has not bound by then:
	// its victims' stop time plus a grace.
	Until time.Time `json:"until"`
}

// JobPeerPorts is how many host ports every part of a multi-node job gets
// for its ranks' own connections to each other (published to the job's
// other parts only): a process that can be told its ports (MPI's TCP
// transport, a framework's own listener) uses them. Rank 0 gets one more,
// the first: MASTER_PORT.
const JobPeerPorts = 8

// Parts returns the requests of every node the session needs: the head (or
// single) part first, then one per Ray worker.
func (q QueueEntry) Parts() []Resources {
	parts := make([]Resources, 0, 1+q.Workers)
	parts = append(parts, q.Request)
	w := *q.WorkerResources()
	for i := 0; i < q.Workers; i++ {
		parts = append(parts, w)
	}
	return parts
}

// WorkerResources is what each worker part asks for: WorkerRequest if
// set, otherwise the head's Request (shared with q, not a copy).
func (q *QueueEntry) WorkerResources() *Resources {
	if q.WorkerRequest != nil {
		return q.WorkerRequest
	}
	return &q.Request
}

// Ports returns how many host ports the part of a session with role needs:
// Jupyter's for a notebook, Ray's GCS, dashboard and client server for a
// Ray head, the node and object managers' for a Ray worker; for a part of
// a multi-node job (Nodes above 1) JobPeerPorts, and MASTER_PORT for rank
// 0 (the head).
func (q QueueEntry) Ports(role Role) int {
	if q.Nodes > 1 && role != RoleSingle {
		if role == RoleHead {
			return 1 + JobPeerPorts
		}
		return JobPeerPorts
	}
	n := 0
	if q.Kind == KindNotebook && role != RoleWorker {
		n++ // jupyter
	}
	switch role {
	case RoleHead:
		n += 3
	case RoleWorker:
		n += 2
	}
	return n
}

// Status is the observed state of a session, stored at status/<id>. The
// API creates it, the placer writes Pending reasons, Bound and Lost, and
// the placers' status merger writes the rest from the parts its agents
// report (PartStatus, MergeParts): no agent writes a status.
type Status struct {
	Session string `json:"session"`
	Phase   Phase  `json:"phase"`
	// Reason is a short CamelCase cause ("Capacity", "Quota", "NoSuchModel",
	// "Cordoned", "NodeLost", "Exited"); Message says it in plain words.
	Reason        string            `json:"reason,omitempty"`
	Message       string            `json:"message,omitempty"`
	QueuePosition int               `json:"queuePosition,omitempty"`
	Nodes         []string          `json:"nodes,omitempty"`
	URLs          map[string]string `json:"urls,omitempty"`
	ExitCode      *int              `json:"exitCode,omitempty"`
	Attempt       int               `json:"attempt,omitempty"`
	// QueueRevision is the mod revision of the queue entry the session's
	// current bindings consumed (Binding.QueueRevision), written by the
	// bind: the status merger folds in only the parts of this queueing.
	// Zero before the first bind, and in statuses from before part keys.
	QueueRevision int64 `json:"queueRevision,omitempty"`
	// GPUShare is the fraction of a shared GPU each part of the current
	// attempt holds (Allocation.Share), written by the bind: GPU-hours
	// count it as its share of a GPU. Nil for whole GPUs and MIG devices.
	GPUShare *GPUShare `json:"gpuShare,omitempty"`
	// Elastic is an elastic job's range and the size its current attempt
	// was bound at (Elastic.Size), written by the bind; its last resize's
	// time and cause.
	Elastic  *Elastic   `json:"elastic,omitempty"`
	Created  time.Time  `json:"created"`
	Updated  time.Time  `json:"updated"`
	Bound    *time.Time `json:"bound,omitempty"`
	Started  *time.Time `json:"started,omitempty"`
	Finished *time.Time `json:"finished,omitempty"`
	// RetryAt is when a session that waits to run again (Phase Pending,
	// Reason BackOff or Preempted, no queue entry yet) is re-queued.
	RetryAt *time.Time `json:"retryAt,omitempty"`
	// Activity is what the agent last saw the running session do.
	Activity *Activity `json:"activity,omitempty"`
}

// Activity is a running session's use, sampled by its head node's agent.
type Activity struct {
	// LastActive is the last moment anything counted as activity: the
	// start, Jupyter's last_activity, a busy kernel, or a GPU at or above
	// the agent's busy percent. Idle culling measures from it.
	LastActive time.Time `json:"lastActive"`
	// Sampled is when this sample was taken. The agent writes a sample
	// only when it changed meaningfully, so an older Sampled does not
	// mean the agent stopped looking.
	Sampled time.Time `json:"sampled"`
	// Jupyter is what the session's Jupyter server reported; nil when it
	// serves none or could not be read.
	Jupyter *JupyterActivity `json:"jupyter,omitempty"`
	// GPUs is each allocated GPU's use on this node.
	GPUs []GPUActivity `json:"gpus,omitempty"`
	// Goodput is the report an elastic job's container last wrote
	// (GoodputFile), as the agent read and validated it; nil when none.
	Goodput *GoodputSample `json:"goodput,omitempty"`
	// GoodputError says why the agent refused the report file, so the
	// job's owner can mend it; empty when none was refused.
	GoodputError string `json:"goodputError,omitempty"`
}

// JupyterActivity is what a Jupyter server's /api/status and /api/kernels say.
type JupyterActivity struct {
	LastActivity time.Time `json:"lastActivity"`
	Kernels      int       `json:"kernels"`
	BusyKernels  int       `json:"busyKernels"`
	Connections  int       `json:"connections"`
}

// GPUActivity is one allocated GPU's use.
type GPUActivity struct {
	UUID               string `json:"uuid"`
	UtilizationPercent int    `json:"utilizationPercent"`
	MemoryUsedMiB      int64  `json:"memoryUsedMiB"`
	Processes          int    `json:"processes"`
	// IdleSince is when the GPU last had a process or utilisation; nil
	// while it has.
	IdleSince *time.Time `json:"idleSince,omitempty"`
	// Unused flags a GPU idle longer than the agent's unused-after time:
	// allocated, but nothing runs on it.
	Unused bool `json:"unused,omitempty"`
	// Simulated marks numbers made up for a simulated GPU.
	Simulated bool `json:"simulated,omitempty"`
}

// GPU is one physical GPU of a node as NVML reports it.
type GPU struct {
	Index     int    `json:"index"`
	UUID      string `json:"uuid"`
	Model     string `json:"model"`
	MemoryMiB int64  `json:"memoryMiB"`
	NUMANode  int    `json:"numaNode"`
	Healthy   bool   `json:"healthy"`
	// Problem says why the agent marked the GPU unhealthy and what would
	// mend it; empty while it is healthy.
	Problem string `json:"problem,omitempty"`
	// NVLinkPeers are the UUIDs of GPUs this one reaches over NVLink.
	NVLinkPeers []string `json:"nvlinkPeers,omitempty"`
	// PCIBusID is the GPU's PCI address as NVML reports it, normalised to
	// "0000:07:00.0" (lower case, four-digit domain); empty when NVML did
	// not say. NCCL's topology file names GPUs by it.
	PCIBusID string `json:"pciBusId,omitempty"`
	// CUDACompute is the GPU's CUDA compute capability as major*10+minor
	// (80 for an A100, 90 for an H100): NCCL's "sm". 0: unknown.
	CUDACompute int `json:"cudaCompute,omitempty"`
	// MIGEnabled means the GPU is partitioned: only its MIGDevices are
	// allocatable, never the whole GPU.
	MIGEnabled bool        `json:"migEnabled,omitempty"`
	MIGDevices []MIGDevice `json:"migDevices,omitempty"`
	// Shared means the operator offers this GPU in fractions
	// (Resources.GPUShareMiB): only fractions are allocated on it, never
	// the GPU whole. Never set on a MIG-enabled GPU (GPU.Mode).
	Shared bool `json:"shared,omitempty"`
	// HeldBy names a session that, when the agent published this
	// inventory, held a device of this GPU in another split than the one
	// listed (the GPU whole while it is listed split into MIG devices, or
	// a MIG device while it is listed whole): while that session holds
	// anything on the node, no device of this GPU is free.
	HeldBy string `json:"heldBy,omitempty"`
}

// MIGDevice is one MIG instance of a partitioned GPU.
type MIGDevice struct {
	UUID      string `json:"uuid"`
	Profile   string `json:"profile"` // e.g. "1g.10gb"
	MemoryMiB int64  `json:"memoryMiB"`
}

// PortRange is an inclusive range of host ports a node hands to sessions.
type PortRange struct {
	First int `json:"first"`
	Last  int `json:"last"`
}

// Node is a node's inventory, stored at nodes/<name> under the agent's
// lease: the key vanishes when the agent stops renewing it.
type Node struct {
	Name      string            `json:"name"`
	Address   string            `json:"address"`
	Labels    map[string]string `json:"labels,omitempty"`
	CPUMilli  int64             `json:"cpuMilli"`
	MemoryMiB int64             `json:"memoryMiB"`
	GPUs      []GPU             `json:"gpus"`
	Ports     PortRange         `json:"ports"`
	// Subnet is the IPv4 subnet (CIDR) of its sessions' own addresses
	// when they have a network of their own (VOYAGER_AGENT_NETWORK
	// isolated): a multi-node job's parts reach each other there
	// (docs/networking.md). Empty on the host's network and with
	// VOYAGER_AGENT_JOB_ROUTES off: its parts are in no job's mesh.
	Subnet string `json:"subnet,omitempty"`
	// Simulated marks an inventory made up by configuration (dev,
	// benchmarks) rather than read from NVML. It is shown wherever nodes are.
	Simulated  bool      `json:"simulated,omitempty"`
	Agent      string    `json:"agent,omitempty"` // agent version
	Registered time.Time `json:"registered"`
}

// Allocation is what one session holds on one node. Owner, groups and
// priority are copied from the session so that fair share, quotas and
// preemption are computed from ledgers alone.
type Allocation struct {
	// Kind is the session's kind: preemption spares notebooks unless configured.
	Kind        SessionKind `json:"kind,omitempty"`
	Owner       string      `json:"owner"`
	Groups      []string    `json:"groups,omitempty"`
	Priority    int         `json:"priority"`
	Preemptible bool        `json:"preemptible,omitempty"`
	Role        Role        `json:"role"`
	GPUs        []string    `json:"gpus,omitempty"` // GPU or MIG device UUIDs
	// Parents names the physical GPU of each device in GPUs that is a
	// part of one (a MIG device), as the inventory the bind checked
	// against said: the allocation keeps excluding that GPU held whole
	// even once a re-registered inventory no longer lists the device. A
	// device not in it is a whole GPU (Allocation.Parent, devices.go).
	Parents map[string]string `json:"parents,omitempty"`
	// Share, when set, says the allocation holds a fraction of its one
	// GPU (a shared GPU), not the GPU whole (share.go).
	Share     *GPUShare `json:"share,omitempty"`
	CPUMilli  int64     `json:"cpuMilli"`
	MemoryMiB int64     `json:"memoryMiB"`
	Ports     []int     `json:"ports,omitempty"`
	// Plan is the plan epoch the placer bound it in: the revision of the
	// snapshot the plan was made on. Placers that see part of an epoch's
	// binds plan that epoch again with those binds pinned, so they agree
	// on the rest of it (placer/README.md, "Plan epochs"). 0: written
	// before epochs, or not by a placer.
	Plan int64 `json:"plan,omitempty"`
	// Queued is when the session's queue entry was created: with the
	// priority, owner and id, its place in the plan's queue order.
	Queued time.Time `json:"queued,omitzero"`
	// Ends is when the session ends at the latest by its max runtime, as
	// the placer estimated it at the bind (the plan's clock plus the max
	// runtime; start-up and an extension make it later); zero: no max
	// runtime. A node whose every allocation has one drains by the
	// latest, and work ending before then may run on it while it is held
	// (placer/hold.go).
	Ends time.Time `json:"ends,omitzero"`
	// Expects is when the session is expected to end, earlier than Ends:
	// the plan's clock plus what its owner's last finished sessions of
	// its size held their GPUs for (RuntimeRecord.Estimate); zero: no
	// estimate below the max runtime. The placer's holds and drain fit
	// read it before Ends while it is still ahead, and Ends once a
	// session runs past it. A pointer, so that a ledger of sessions
	// without one carries no field (the codec writes zero times).
	Expects *time.Time `json:"expects,omitempty"`
	// Team is the team the session is charged to (QueueEntry.Team): fair
	// share, team maxima and reclaim count the allocation against it and
	// its ancestors (placer/teams.go). Empty where no team exists.
	Team string `json:"team,omitempty"`
	// GPUModel is the part's request's GPU model pattern
	// (Resources.GPUModel), empty for none: a session planned again from
	// its allocation (placer/epoch.go) is ordered by the same guaranteed
	// model as its request was (placer/teammodels.go).
	GPUModel string `json:"gpuModel,omitempty"`
}

// Ledger is what is allocated on a node, stored at ledger/<name>. The
// placer adds to it in the same transaction as the bindings; the agent
// removes from it in the same transaction that deletes a binding.
type Ledger struct {
	Node        string                `json:"node"`
	Allocations map[string]Allocation `json:"allocations"` // by session id
}

// GPUOwners returns which session holds each allocated device UUID.
func (l Ledger) GPUOwners() map[string]string {
	m := make(map[string]string)
	for id, a := range l.Allocations {
		for _, g := range a.GPUs {
			m[g] = id
		}
	}
	return m
}

// Used returns the CPU and memory allocated on the node.
func (l Ledger) Used() (cpuMilli, memoryMiB int64) {
	for _, a := range l.Allocations {
		cpuMilli += a.CPUMilli
		memoryMiB += a.MemoryMiB
	}
	return cpuMilli, memoryMiB
}

// UsedPorts returns every allocated port, sorted.
func (l Ledger) UsedPorts() []int {
	var ps []int
	for _, a := range l.Allocations {
		ps = append(ps, a.Ports...)
	}
	sort.Ints(ps)
	return ps
}

// Binding tells a node's agent to run its part of a session, stored at
// bindings/<node>/<id>.
type Binding struct {
	Session string `json:"session"`
	Node    string `json:"node"`
	Role    Role   `json:"role"`
	// Worker is the worker's index (1-based) for RoleWorker, else 0.
	Worker int      `json:"worker,omitempty"`
	GPUs   []string `json:"gpus,omitempty"` // device UUIDs, exact
	// Share, when set, is the fraction of its one GPU the part holds:
	// the agent enforces its memory and compute limits.
	Share     *GPUShare `json:"share,omitempty"`
	CPUMilli  int64     `json:"cpuMilli"`
	MemoryMiB int64     `json:"memoryMiB"`
	Ports     []int     `json:"ports,omitempty"`
	// HeadNode is the node of the Ray head, for workers.
	HeadNode string `json:"headNode,omitempty"`
	// QueueRevision is the mod revision of the pending/<id> entry this
	// binding consumed: unique per queueing, so a binding names exactly
	// which attempt of the session it serves.
	QueueRevision int64 `json:"queueRevision"`
	Attempt       int   `json:"attempt"`
	// Scores are the named scores that chose this node: "why here".
	Scores map[string]float64 `json:"scores,omitempty"`
	Placer string             `json:"placer,omitempty"`
	Bound  time.Time          `json:"bound"`
}

// Cordon stops new sessions landing on a node, stored at cordons/<name>.
type Cordon struct {
	Node   string    `json:"node"`
	Reason string    `json:"reason,omitempty"`
	By     string    `json:"by,omitempty"`
	Since  time.Time `json:"since"`
	// Drain also asks running notebook sessions to stop by Deadline;
	// batch sessions run to completion.
	Drain    bool       `json:"drain,omitempty"`
	Deadline *time.Time `json:"deadline,omitempty"`
}

// QuotaScope is whom a quota caps.
type QuotaScope string

// Quota scopes, also the key directory names under quotas/.
const (
	QuotaUsers  QuotaScope = "users"
	QuotaGroups QuotaScope = "groups"
	// QuotaTeams is a team's maximum (Team.MaxGPUs): its limit is the
	// team key teams/<name> (QuotaOf), not a key under quotas/.
	QuotaTeams QuotaScope = "teams"
)

// Quota caps what one user or group may hold at once, stored at
// quotas/users/<name> or quotas/groups/<name>. A nil field is unlimited.
// Weight is the subject's fair-share weight (nil: 1): the placer orders
// owners by dominant share divided by weight, so a user or group of
// weight 3 is served as if it held a third of what it holds.
type Quota struct {
	GPUs      *int64   `json:"gpus,omitempty"`
	CPUMilli  *int64   `json:"cpuMilli,omitempty"`
	MemoryMiB *int64   `json:"memoryMiB,omitempty"`
	Weight    *float64 `json:"weight,omitempty"`
}

// Profile is a named, admin-defined session template, stored at
// profiles/<name>.
type Profile struct {
	Name        string            `json:"name"`
	Description string            `json:"description,omitempty"`
	Kind        SessionKind       `json:"kind,omitempty"`
	Image       string            `json:"image,omitempty"`
	Resources   Resources         `json:"resources"`
	Env         map[string]string `json:"env,omitempty"`
	Limits      Limits            `json:"limits"`
	// Egress, when it denies, binds every session of the profile: its
	// owner may narrow Allow but not widen it.
	Egress *Egress `json:"egress,omitempty"`
	// ShmMiB is the /dev/shm of the profile's sessions; 0: the cluster
	// default. A session may ask for another size up to MaxShmMiB (and
	// never above its memory).
	ShmMiB int64 `json:"shmMiB,omitempty"`
	// MaxShmMiB is the most /dev/shm a session of the profile may ask
	// for; 0: no cap of the profile's own (the session's memory caps it).
	MaxShmMiB int64 `json:"maxShmMiB,omitempty"`
	// Ulimits are the profile's sessions' memlock and open-file limits
	// (a field 0: the cluster's); a session's own ulimits override them
	// field by field, up to the cluster's caps.
	Ulimits *Ulimits `json:"ulimits,omitempty"`
	// Volumes are mounted into every session of the profile, each only
	// if the session's owner may mount it anyway (Volume.Allows). A
	// session that names one of them itself moves it to its own mount
	// path; a read-only one stays read-only.
	Volumes []VolumeRef `json:"volumes,omitempty"`
}

// RayToken is a Ray session's authentication token, stored at
// raytokens/<id>: every part of the session runs with it as Ray's
// RAY_AUTH_TOKEN (and RAY_AUTH_MODE=token), so Ray 2.52 and later refuse
// whoever lacks it; the agent's dashboard proxy presents it.
type RayToken struct {
	Session string `json:"session"`
	Token   string `json:"token"`
}

// Placer announces a live placer, stored at placers/<id> under the placer's
// lease. Live placers split the nodes among themselves by rendezvous hashing.
type Placer struct {
	ID      string    `json:"id"`
	Host    string    `json:"host,omitempty"`
	Started time.Time `json:"started"`
}
