package api

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
)

// SessionRequest is the body of POST /api/v1/sessions. Fields left out
// come from Profile when one is named, else from the defaults below.
type SessionRequest struct {
	// Kind is "notebook" or "batch".
	Kind state.SessionKind `json:"kind,omitempty"`
	// Name is an optional label (1-63 lower-case letters, digits, . _ -).
	Name string `json:"name,omitempty"`
	// Profile names an admin-defined template (GET /api/v1/profiles).
	Profile string `json:"profile,omitempty"`
	// Image is the container image; empty: the profile's, else the node
	// agent's default image.
	Image string `json:"image,omitempty"`
	// Command runs in the container; required for batch sessions.
	Command []string `json:"command,omitempty"`
	// Env is added to the container's environment (over the profile's).
	Env map[string]string `json:"env,omitempty"`
	// Resources is what the session's (head) node provides. With a
	// profile, each field that is set (non-zero) overrides the profile's.
	// cpuMilli defaults to 1000 and memoryMiB to 4096, for a session
	// without GPUs to 500 and 1024.
	Resources *state.Resources `json:"resources,omitempty"`
	// Ray asks for Ray workers on more nodes.
	Ray *state.Ray `json:"ray,omitempty"`
	// Nodes runs a batch session as a multi-node job: this many parts,
	// each with Resources on its own machine (rank 0 to Nodes-1), bound
	// all-or-nothing. 0 or 1: one machine.
	Nodes int `json:"nodes,omitempty"`
	// Elastic asks that a batch job run at any size from elastic.min to
	// elastic.max GPUs on one machine, resized with the cluster's load;
	// resources.gpus is then left out (or equal to elastic.min).
	Elastic *ElasticRequest `json:"elastic,omitempty"`
	// OnPartFailure is what a multi-node job does when one part fails:
	// "StopAll" (the default) ends the job and stops the other parts;
	// "Continue" lets them run until rank 0 ends.
	OnPartFailure string `json:"onPartFailure,omitempty"`
	// Limits bound the session's life. With a profile, each field that is
	// set (non-zero) overrides the profile's, so {"maxRuntime": "4h"}
	// keeps the profile's idleTimeout.
	Limits *state.Limits `json:"limits,omitempty"`
	// Priority orders the queue: -100 to 100, higher first, and at most
	// the team's maxPriority unless the caller is an admin. Default 0.
	Priority int `json:"priority,omitempty"`
	// Team is the team the session is charged to: one of the caller's
	// (GET /api/v1/teams shows them). Empty: her default team.
	Team string `json:"team,omitempty"`
	// Preemptible sessions may be stopped for higher-priority ones.
	Preemptible bool `json:"preemptible,omitempty"`
	// Restart is the restart policy of batch sessions.
	Restart *state.RestartPolicy `json:"restart,omitempty"`
	// Egress limits where the session's containers may connect:
	// {"deny": true, "allow": ["10.20.0.0/16"]}. A profile that denies
	// egress binds its sessions; they may narrow its allow list only.
	Egress *state.Egress `json:"egress,omitempty"`
	// ShmMiB sizes /dev/shm, at most resources.memoryMiB (its pages count
	// against the session's memory). 0: the cluster default
	// (VOYAGER_DEFAULT_SHM_MIB, at most half of memoryMiB).
	ShmMiB int64 `json:"shmMiB,omitempty"`
	// Ulimits ask for memlock and open-file limits up to the cluster's
	// (VOYAGER_ULIMIT_MEMLOCK, VOYAGER_ULIMIT_NOFILE); a field left 0
	// gets the cluster's.
	Ulimits *state.Ulimits `json:"ulimits,omitempty"`
	// Volumes are operator-defined volumes (GET /api/v1/volumes) to mount.
	Volumes []VolumeRequest `json:"volumes,omitempty"`
}

// VolumeRequest asks for one volume in a session: its name, mount path
// and whether to mount it read-only.
type VolumeRequest = state.VolumeRef

// Limits of a request, so that one request cannot exhaust etcd or a node.
const (
	maxGPUs        = 64
	maxWorkers     = 64
	maxCommandArgs = 256
	maxEnv         = 128
	maxEnvValue    = 32 << 10
	maxImage       = 512
	maxPriority    = 100
	maxRestarts    = 100
	defaultCPU     = 1000
	defaultMemory  = 4096
	// A session without GPUs (a script's helper job, a CPU notebook) gets
	// less by default: what `voyager run -- sh -c …` needs, so that it
	// fits beside the notebooks of a small node instead of queueing.
	defaultCPUNoGPU    = 500
	defaultMemoryNoGPU = 1024
	// maxGroupsBytes bounds the groups a session records (from the
	// token's groups claim): every ledger allocation repeats them, and a
	// node's ledger is one etcd value.
	maxGroupsBytes = 1024
)

// admission are the cluster's bounds on one request, from api.Config.
type admission struct {
	// maxRuntimeCap (0: none) bounds limits.maxRuntime.
	maxRuntimeCap time.Duration
	// minCPU and minMemory are the least a session or worker may ask for.
	minCPU, minMemory int64
	// maxWorkers is the most Ray workers whose bind fits one transaction.
	maxWorkers int
	// maxTxnOps is the transaction limit maxWorkers derives from.
	maxTxnOps int
	// defaultShm is the /dev/shm of sessions that name none, capped at
	// half their memory.
	defaultShm int64
	// nofile and memlock are the ulimits sessions get, and the most they
	// may ask for (memlock state.UlimitUnlimited: none).
	nofile, memlock int64
}

var (
	envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
	migRE     = regexp.MustCompile(`^[1-9][0-9]*g\.[1-9][0-9]*gb$`)
	labelRE   = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?$`)
	imageRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$`)
)

// buildSession merges the request over its profile (which may be nil) and
// validates the result against the bounds of adm. It returns every invalid
// field, or the spec less its id, owner and times.
func buildSession(req SessionRequest, prof *state.Profile, adm admission) (state.Session, []volumeAsk, []FieldError) {
	maxRuntimeCap := adm.maxRuntimeCap
	var errs []FieldError
	add := func(field, format string, args ...any) {
		errs = append(errs, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
	}
	s := state.Session{Name: req.Name, Profile: req.Profile, Desired: state.DesiredRunning}
	if prof != nil {
		s.Kind, s.Image, s.Resources, s.Limits = prof.Kind, prof.Image, prof.Resources, prof.Limits
		if len(prof.Env) > 0 {
			s.Env = map[string]string{}
			for k, v := range prof.Env {
				s.Env[k] = v
			}
		}
	}
	if req.Kind != "" {
		s.Kind = req.Kind
	}
	if req.Image != "" {
		s.Image = req.Image
	}
	if r := req.Resources; r != nil {
		// Set (non-zero) fields override the profile's, one by one, so
		// {"gpus": 2} on an A100 profile keeps its GPU model.
		if prof == nil {
			s.Resources = *r
		} else {
			over := &s.Resources
			if r.GPUs != 0 {
				over.GPUs = r.GPUs
			}
			if r.GPUModel != "" {
				over.GPUModel = r.GPUModel
			}
			if r.GPUMemoryMiB != 0 {
				over.GPUMemoryMiB = r.GPUMemoryMiB
			}
			// A MIG profile and a fraction are one choice of GPU kind:
			// a request naming one replaces the profile's other (naming
			// both is refused below).
			if r.MIGProfile != "" {
				over.MIGProfile = r.MIGProfile
				if r.GPUShareMiB == 0 {
					over.GPUShareMiB, over.GPUComputePercent = 0, 0
				}
			}
			if r.GPUShareMiB != 0 {
				over.GPUShareMiB = r.GPUShareMiB
				if r.MIGProfile == "" {
					over.MIGProfile = ""
				}
			}
			if r.GPUComputePercent != 0 {
				over.GPUComputePercent = r.GPUComputePercent
			}
			if r.CPUMilli != 0 {
				over.CPUMilli = r.CPUMilli
			}
			if r.MemoryMiB != 0 {
				over.MemoryMiB = r.MemoryMiB
			}
			if r.NodeSelector != nil {
				over.NodeSelector = r.NodeSelector
			}
		}
	}
	// Limits merge field by field too: a request that sets only maxRuntime
	// keeps the profile's idleTimeout. A zero field means "the profile's"
	// (or, without one, the cluster default).
	fromProfile := prof != nil && prof.Limits.MaxRuntime != 0
	if l := req.Limits; l != nil {
		if l.MaxRuntime != 0 {
			s.Limits.MaxRuntime = l.MaxRuntime
			fromProfile = false
		}
		if l.IdleTimeout != 0 {
			s.Limits.IdleTimeout = l.IdleTimeout
		}
	}
	// A profile's idle timeout means nothing to a batch session made from
	// it; only a request's own is refused below.
	if s.Kind == state.KindBatch && (req.Limits == nil || req.Limits.IdleTimeout == 0) {
		s.Limits.IdleTimeout = 0
	}
	for k, v := range req.Env {
		if s.Env == nil {
			s.Env = map[string]string{}
		}
		s.Env[k] = v
	}
	s.Command, s.Ray, s.Priority, s.Preemptible = req.Command, req.Ray, req.Priority, req.Preemptible
	s.Nodes, s.OnPartFailure = req.Nodes, req.OnPartFailure
	s.Egress = mergeEgress(prof, req.Egress, add)
	if req.Restart != nil {
		s.Restart = *req.Restart
	}
	if e := req.Elastic; e != nil && e.Min > 0 && (req.Resources == nil || req.Resources.GPUs == 0) {
		s.Resources.GPUs = e.Min // an elastic job needs its minimum at the least
	}
	cpu, mem := int64(defaultCPU), int64(defaultMemory)
	if s.Resources.GPUs == 0 {
		cpu, mem = defaultCPUNoGPU, defaultMemoryNoGPU
	}
	if s.Resources.CPUMilli == 0 {
		s.Resources.CPUMilli = cpu
	}
	if s.Resources.MemoryMiB == 0 {
		s.Resources.MemoryMiB = mem
	}

	switch s.Kind {
	case state.KindNotebook, state.KindBatch:
	case "":
		add("kind", `required: "notebook" or "batch" (or a profile that sets it)`)
	default:
		add("kind", `got %q, want "notebook" or "batch"`, s.Kind)
	}
	if s.Name != "" {
		if err := state.ValidateName("name", s.Name); err != nil {
			add("name", "want 1-63 lower-case letters, digits, '.', '_' or '-', starting and ending with a letter or digit")
		}
	}
	// An empty image is the node agent's default (VOYAGER_AGENT_IMAGE).
	switch {
	case s.Image == "":
	case len(s.Image) > maxImage || !imageRE.MatchString(s.Image):
		add("image", "got %q, want an image reference such as docker.io/library/python:3.12 (at most %d characters)", truncate(s.Image, 80), maxImage)
	}
	switch {
	case s.Kind == state.KindBatch && len(s.Command) == 0:
		add("command", `required for a batch session: the program and its arguments, e.g. ["python", "train.py"]`)
	case len(s.Command) > maxCommandArgs:
		add("command", "has %d arguments, want at most %d", len(s.Command), maxCommandArgs)
	case len(s.Command) > 0 && s.Command[0] == "":
		add("command[0]", "want the program to run, not an empty string")
	}
	if len(s.Env) > maxEnv {
		add("env", "has %d variables, want at most %d", len(s.Env), maxEnv)
	}
	for _, k := range sortedKeys(s.Env) {
		switch {
		case !envNameRE.MatchString(k):
			add("env."+k, "want a variable name of letters, digits and '_', not starting with a digit")
		case strings.HasPrefix(k, "VOYAGER_") || k == "JUPYTER_TOKEN":
			add("env."+k, "is set by Voyager itself; choose another name")
		case len(s.Env[k]) > maxEnvValue:
			add("env."+k, "value has %d bytes, want at most %d", len(s.Env[k]), maxEnvValue)
		}
	}
	validateResources("resources", s.Resources, add)
	adm.minimums("resources", s.Resources, add)
	if s.Ray != nil {
		limit := maxWorkers
		if adm.maxWorkers > 0 {
			limit = min(limit, adm.maxWorkers)
		}
		switch {
		case s.Ray.Workers > limit && limit < maxWorkers:
			add("ray.workers", "got %d, want at most %d: a Ray session binds its head and every worker, each on its own node, in one etcd transaction, and %d workers need more than the %d operations one may hold (VOYAGER_PLACER_MAX_TXN_OPS, at most etcd's --max-txn-ops)",
				s.Ray.Workers, limit, s.Ray.Workers, adm.maxTxnOps)
		case s.Ray.Workers < 0 || s.Ray.Workers > limit:
			add("ray.workers", "got %d, want 0 to %d", s.Ray.Workers, limit)
		}
		if s.Ray.WorkerResources != nil {
			validateResources("ray.workerResources", *s.Ray.WorkerResources, add)
			adm.minimums("ray.workerResources", *s.Ray.WorkerResources, add)
		}
		if s.Ray.Workers == 0 && s.Ray.WorkerResources == nil {
			s.Ray = nil
		}
	}
	validateElasticNodes(req.Elastic, &s, adm.nodesLimit(), add)
	adm.validateNodes(&s, add)
	validateElastic(req.Elastic, &s, add)
	switch {
	case s.Limits.MaxRuntime < 0:
		add("limits.maxRuntime", "got %s, want 0 (no limit) or a positive duration such as \"8h\"", s.Limits.MaxRuntime.Std())
	case maxRuntimeCap > 0 && s.Limits.MaxRuntime.Std() > maxRuntimeCap && fromProfile:
		add("limits.maxRuntime", "profile %q sets %s, above the cluster's cap of %s; ask for at most %s, or ask an admin to fix the profile", prof.Name, s.Limits.MaxRuntime.Std(), maxRuntimeCap, maxRuntimeCap)
	case maxRuntimeCap > 0 && s.Limits.MaxRuntime.Std() > maxRuntimeCap:
		add("limits.maxRuntime", "got %s, above the cluster's cap of %s; want at most %s", s.Limits.MaxRuntime.Std(), maxRuntimeCap, maxRuntimeCap)
	}
	if s.Limits.IdleTimeout < 0 {
		add("limits.idleTimeout", "got %s, want 0 (the cluster default) or a positive duration such as \"2h\"", s.Limits.IdleTimeout.Std())
	}
	if s.Limits.IdleTimeout > 0 && s.Kind == state.KindBatch {
		add("limits.idleTimeout", "applies to notebook sessions only; a batch session ends when its command does")
	}
	if s.Priority < -maxPriority || s.Priority > maxPriority {
		add("priority", "got %d, want %d to %d", s.Priority, -maxPriority, maxPriority)
	}
	switch s.Restart.Policy {
	case "", state.RestartNever:
		if s.Restart.MaxRestarts != 0 {
			add("restart.maxRestarts", `applies only with policy "OnFailure"`)
		}
	case state.RestartOnFailure:
		if s.Kind != state.KindBatch {
			add("restart.policy", `"OnFailure" applies to batch sessions only; want "Never" for a notebook`)
		}
		if s.Restart.MaxRestarts == 0 {
			add("restart.maxRestarts", `required with policy "OnFailure": want 1 to %d restarts`, maxRestarts)
		}
	default:
		add("restart.policy", `got %q, want "Never" or "OnFailure"`, s.Restart.Policy)
	}
	if s.Restart.MaxRestarts < 0 || s.Restart.MaxRestarts > maxRestarts {
		add("restart.maxRestarts", "got %d, want 0 to %d", s.Restart.MaxRestarts, maxRestarts)
	}
	if s.Restart.Backoff < 0 || s.Restart.Backoff.Std() > 24*time.Hour {
		add("restart.backoff", "got %s, want a duration from 0 to 24h", s.Restart.Backoff.Std())
	}
	if s.Restart.Policy == "" {
		s.Restart.Policy = state.RestartNever
	}
	s.ShmMiB, s.Ulimits = adm.resources(s, req.ShmMiB, req.Ulimits, prof, add)
	vols := mergeVolumes(prof, req.Volumes)
	if len(vols) > maxVolumes {
		add("volumes", "has %d volumes (with the profile's), want at most %d", len(vols), maxVolumes)
	} else {
		validateVolumeRequests(vols, add)
	}
	return s, vols, errs
}

// volumeAsk is one volume a session will mount: asked for by its request
// (field "volumes[i]"), by its profile, or by both.
type volumeAsk struct {
	state.VolumeRef
	// field is the request's field that names it, or the profile's.
	field string
	// profile names the profile that mounts it; "" when only the
	// request asks for it.
	profile string
}

// mergeVolumes returns the volumes of a session: the request's, in its
// order, then the profile's that the request does not name. A request
// that names a volume of its profile moves it to its own mount path; it
// is read-only when either asks.
func mergeVolumes(prof *state.Profile, reqs []VolumeRequest) []volumeAsk {
	out := make([]volumeAsk, 0, len(reqs))
	named := map[string]bool{}
	for i, r := range reqs {
		a := volumeAsk{VolumeRef: r, field: fmt.Sprintf("volumes[%d]", i)}
		if prof != nil {
			for _, pv := range prof.Volumes {
				if pv.Name == r.Name {
					a.profile, a.ReadOnly = prof.Name, r.ReadOnly || pv.ReadOnly
				}
			}
		}
		named[r.Name] = true
		out = append(out, a)
	}
	if prof != nil {
		for j, pv := range prof.Volumes {
			if !named[pv.Name] {
				out = append(out, volumeAsk{VolumeRef: pv, field: fmt.Sprintf("profile.volumes[%d]", j), profile: prof.Name})
			}
		}
	}
	return out
}

// nodesLimit is the most machines one multi-node job may have: ranks 1
// to nodes-1 bind as a Ray session's workers do, in the same one
// transaction.
func (adm admission) nodesLimit() int {
	limit := maxWorkers + 1
	if adm.maxWorkers > 0 {
		limit = min(limit, adm.maxWorkers+1)
	}
	return limit
}

// validateNodes checks a multi-node job's nodes and onPartFailure, and
// sets the default onPartFailure (StopAll) of one.
func (adm admission) validateNodes(s *state.Session, add func(field, format string, args ...any)) {
	limit := adm.nodesLimit()
	switch {
	case s.Nodes < 0:
		add("nodes", "got %d, want 0 or 1 (one machine) or 2 to %d machines for a multi-node job", s.Nodes, limit)
	case s.Nodes > 1 && s.Kind != state.KindBatch && s.Kind != "":
		add("nodes", "got %d for a %s session; want a batch session (kind \"batch\") for a multi-node job, or ray.workers for a notebook's Ray cluster across machines", s.Nodes, s.Kind)
	case s.Nodes > 1 && s.Ray != nil && s.Ray.Workers > 0:
		add("nodes", "got %d with ray.workers %d; a multi-node job and a Ray cluster are two ways to use several machines: ask for one (nodes for torchrun, DeepSpeed, Horovod or MPI; ray.workers for Ray)", s.Nodes, s.Ray.Workers)
	case s.Nodes > limit && limit < maxWorkers+1:
		add("nodes", "got %d, want at most %d: a multi-node job binds every part, each on its own node, in one etcd transaction, and %d parts need more than the %d operations one may hold (VOYAGER_PLACER_MAX_TXN_OPS, at most etcd's --max-txn-ops)",
			s.Nodes, limit, s.Nodes, adm.maxTxnOps)
	case s.Nodes > limit:
		add("nodes", "got %d, want 0 to %d", s.Nodes, limit)
	}
	switch s.OnPartFailure {
	case "":
		if s.Nodes > 1 {
			s.OnPartFailure = state.PartFailureStopAll
		}
	case state.PartFailureStopAll, state.PartFailureContinue:
		if s.Nodes <= 1 {
			add("onPartFailure", "applies to multi-node jobs only; want nodes of 2 or more, or leave onPartFailure out")
		}
	default:
		add("onPartFailure", "got %q, want %q (one part failing ends the job and stops the rest) or %q (the rest run on until rank 0 ends)",
			s.OnPartFailure, state.PartFailureStopAll, state.PartFailureContinue)
	}
	if s.Nodes == 1 {
		s.Nodes = 0 // one machine, as without nodes
	}
}

// maxVolumes bounds the volumes of one session.
const maxVolumes = 16

// resources sizes /dev/shm and the ulimits of session s from what its
// request asked for over its profile's (prof may be nil). shm 0, a nil
// ulimits or a zero field take the profile's, else the cluster's default.
// /dev/shm is a tmpfs whose pages are charged to the container's memory
// cgroup, so it may not exceed the memory of any part of the session;
// the default takes at most half of it. A request may ask for more than
// its profile's shm up to the profile's maxShmMiB; ulimits up to the
// cluster's caps, as without a profile.
func (adm admission) resources(s state.Session, shm int64, u *state.Ulimits, prof *state.Profile, add func(field, format string, args ...any)) (int64, *state.Ulimits) {
	mem := s.Resources.MemoryMiB
	if s.Ray != nil && s.Ray.WorkerResources != nil && s.Ray.WorkerResources.MemoryMiB > 0 {
		mem = min(mem, s.Ray.WorkerResources.MemoryMiB)
	}
	fromProfile := shm == 0 && prof != nil && prof.ShmMiB > 0
	if fromProfile {
		shm = prof.ShmMiB
	}
	switch {
	case shm < 0:
		add("shmMiB", "got %d, want 0 (the profile's or the cluster default) or MiB above 0, e.g. 8192", shm)
	case shm == 0:
		shm = max(min(adm.defaultShm, mem/2), 1)
	case !fromProfile && prof != nil && prof.MaxShmMiB > 0 && shm > prof.MaxShmMiB:
		add("shmMiB", "got %d MiB, above profile %q's maxShmMiB of %d; ask for at most %d, leave shmMiB out for the profile's %s, or choose another profile",
			shm, prof.Name, prof.MaxShmMiB, prof.MaxShmMiB, shmText(prof.ShmMiB))
	case shm > mem && fromProfile:
		add("shmMiB", "profile %q sets %d MiB, above the session's memoryMiB (%d): /dev/shm is a tmpfs whose pages count against the session's memory limit; ask for at least %d memoryMiB, or for shmMiB of at most %d",
			prof.Name, shm, mem, shm, mem)
	case shm > mem:
		add("shmMiB", "got %d MiB, above the session's memoryMiB (%d): /dev/shm is a tmpfs whose pages count against the session's memory limit; ask for at most %d, or for more memoryMiB", shm, mem, mem)
	}
	out := state.Ulimits{Nofile: adm.nofile, MemlockKiB: adm.memlock}
	if prof != nil && prof.Ulimits != nil {
		adm.overlayUlimits(&out, *prof.Ulimits, func(field, format string, args ...any) {
			add(field, "profile %q: "+format+"; ask an admin to fix the profile, or set "+field+" yourself", append([]any{prof.Name}, args...)...)
		})
	}
	if u != nil {
		adm.overlayUlimits(&out, *u, add)
	}
	return shm, &out
}

// shmText names a profile's shm size for a message.
func shmText(mib int64) string {
	if mib == 0 {
		return "size (the cluster default)"
	}
	return fmt.Sprintf("%d MiB", mib)
}

// overlayUlimits sets the non-zero fields of u over out, each checked
// against the cluster's caps; add receives what is out of bounds.
func (adm admission) overlayUlimits(out *state.Ulimits, u state.Ulimits, add func(field, format string, args ...any)) {
	switch {
	case u.Nofile < 0 || u.Nofile > adm.nofile:
		add("ulimits.nofile", "got %d, want 0 (the cluster's %d) or 64 to %d (VOYAGER_ULIMIT_NOFILE)", u.Nofile, adm.nofile, adm.nofile)
	case u.Nofile > 0 && u.Nofile < 64:
		add("ulimits.nofile", "got %d, want at least 64: a process needs a few descriptors to start", u.Nofile)
	case u.Nofile > 0:
		out.Nofile = u.Nofile
	}
	unlimited := adm.memlock == state.UlimitUnlimited
	switch {
	case u.MemlockKiB == 0:
	case u.MemlockKiB < state.UlimitUnlimited || (u.MemlockKiB == state.UlimitUnlimited && !unlimited) || (!unlimited && u.MemlockKiB > adm.memlock):
		most := "unlimited (-1)"
		if !unlimited {
			most = fmt.Sprintf("%d KiB", adm.memlock)
		}
		add("ulimits.memlockKiB", "got %d, want 0 (the cluster's), -1 (unlimited) or KiB, at most %s (VOYAGER_ULIMIT_MEMLOCK)", u.MemlockKiB, most)
	default:
		out.MemlockKiB = u.MemlockKiB
	}
}

// reservedMounts are container paths a volume may neither cover nor sit
// under: the system's, and where Voyager mounts its own files.
var reservedMounts = []string{"/proc", "/sys", "/dev", "/etc", "/run", "/var/run", "/usr", "/bin", "/sbin",
	"/lib", "/lib32", "/lib64", "/libx32", "/boot"}

// coveringMounts are container paths a volume may sit under but not cover:
// the home (nodeagent.HomePath) and the directories that hold it.
var coveringMounts = []string{"/", "/home", "/home/jovyan", "/tmp", "/var"}

// validateVolumeRequests checks the names and mount paths of a session's
// volumes; whether each exists and the owner may mount it is checked
// against etcd when they are resolved.
func validateVolumeRequests(vs []volumeAsk, add func(field, format string, args ...any)) {
	seen := map[string]bool{}
	for i, v := range vs {
		f := v.field
		if err := state.ValidateName("volume", v.Name); err != nil {
			add(f+".name", "got %q, want a volume's name (1-63 lower-case letters, digits, '.', '_' or '-'); GET /api/v1/volumes lists those you may mount", truncate(v.Name, 64))
		} else if seen[v.Name] {
			add(f+".name", "volume %q is asked for twice; mount it once", v.Name)
		}
		seen[v.Name] = true
		p := v.MountPath
		switch {
		case !path.IsAbs(p) || path.Clean(p) != p || len(p) > 256 || strings.ContainsAny(p, ":,\x00"):
			add(f+".mountPath", "got %q, want a clean absolute path of at most 256 characters without ':' or ',', such as /data", truncate(p, 80))
			continue
		case slices.Contains(coveringMounts, p):
			add(f+".mountPath", "got %q, which would hide the container's own files or its home; want a directory of its own such as /data or /home/jovyan/data", p)
			continue
		}
		for _, r := range reservedMounts {
			if p == r || strings.HasPrefix(p, r+"/") {
				add(f+".mountPath", "got %q, under the system directory %s; want a directory of its own such as /data", p, r)
			}
		}
		for _, o := range vs[:i] {
			if o.MountPath == p || strings.HasPrefix(p, o.MountPath+"/") || strings.HasPrefix(o.MountPath, p+"/") {
				add(f+".mountPath", "got %q, which overlaps %s.mountPath %q (volume %s); want separate directories", p, o.field, o.MountPath, o.Name)
			}
		}
	}
}

// minimums refuses requests below the cluster's least CPU and memory: a node
// holds at most VOYAGER_MAX_SESSIONS_PER_NODE sessions, and tiny requests
// would fill that with nothing.
func (adm admission) minimums(prefix string, r state.Resources, add func(field, format string, args ...any)) {
	if r.CPUMilli >= 0 && r.CPUMilli < adm.minCPU {
		add(prefix+".cpuMilli", "got %d, want at least %d (the cluster's minimum, VOYAGER_MIN_CPU_MILLI)", r.CPUMilli, adm.minCPU)
	}
	if r.MemoryMiB >= 0 && r.MemoryMiB < adm.minMemory {
		add(prefix+".memoryMiB", "got %d, want at least %d MiB (the cluster's minimum, VOYAGER_MIN_MEMORY_MIB)", r.MemoryMiB, adm.minMemory)
	}
}

// validateGroups bounds the groups a session records.
func validateGroups(groups []string) []FieldError {
	n := 2
	for _, g := range groups {
		n += len(g) + 3
	}
	if n <= maxGroupsBytes {
		return nil
	}
	return []FieldError{{Field: "token groups", Message: fmt.Sprintf(
		"your token lists %d groups in %d bytes; a session records at most %d bytes of groups (every allocation on a node repeats them, and a node's ledger is one etcd value); ask for a token whose groups claim (VOYAGER_JWT_GROUPS_CLAIM) lists fewer",
		len(groups), n, maxGroupsBytes)}}
}

func validateResources(prefix string, r state.Resources, add func(field, format string, args ...any)) {
	if r.GPUs < 0 || r.GPUs > maxGPUs {
		add(prefix+".gpus", "got %d, want 0 to %d", r.GPUs, maxGPUs)
	}
	if r.GPUModel != "" {
		if err := placer.ValidateModelPattern(r.GPUModel); err != nil {
			add(prefix+".gpuModel", "got %q, want a shell pattern over the model name such as \"*A100*\"", r.GPUModel)
		}
	}
	if r.GPUMemoryMiB < 0 {
		add(prefix+".gpuMemoryMiB", "got %d, want 0 or more MiB", r.GPUMemoryMiB)
	}
	if r.MIGProfile != "" && !migRE.MatchString(r.MIGProfile) {
		add(prefix+".migProfile", "got %q, want a MIG profile such as \"1g.10gb\" or \"3g.40gb\"", r.MIGProfile)
	}
	if r.GPUs == 0 && (r.GPUModel != "" || r.GPUMemoryMiB != 0 || r.MIGProfile != "") {
		add(prefix+".gpus", "is 0 but a GPU model, memory or MIG profile is set; want 1 or more GPUs")
	}
	validateShare(prefix, r, add)
	if r.CPUMilli < 0 {
		add(prefix+".cpuMilli", "got %d, want thousandths of a core above 0, e.g. 4000 for 4 cores", r.CPUMilli)
	}
	if r.MemoryMiB < 0 {
		add(prefix+".memoryMiB", "got %d, want MiB above 0, e.g. 16384", r.MemoryMiB)
	}
	for _, k := range sortedKeys(r.NodeSelector) {
		if !labelRE.MatchString(k) || len(r.NodeSelector[k]) > 63 {
			add(prefix+".nodeSelector."+k, "want a label key of letters, digits, '.', '_', '/' or '-' and a value of at most 63 characters")
		}
	}
}

// feasibility checks a valid spec against the live nodes: a GPU model no
// node has, or a request larger than any node could ever hold, is refused
// with why. With no nodes registered at all, every request is accepted and
// waits: the cluster may be starting.
func feasibility(s state.Session, nodes []state.Node, plan placer.PlanOptions, now time.Time) []FieldError {
	if len(nodes) == 0 {
		return nil
	}
	var errs []FieldError
	check := func(prefix string, r state.Resources) {
		if r.GPUs == 0 || r.GPUModel == "" {
			return
		}
		models := map[string]int{}
		found := false
		for _, n := range nodes {
			for _, g := range n.GPUs {
				models[g.Model]++
				if ok, _ := path.Match(r.GPUModel, g.Model); ok {
					found = true
				}
			}
		}
		if !found {
			var have []string
			for _, m := range sortedKeys(models) {
				have = append(have, fmt.Sprintf("%s (%d)", m, models[m]))
			}
			msg := fmt.Sprintf("no node has a GPU matching %q", r.GPUModel)
			if len(have) > 0 {
				msg += "; the GPU models present are " + strings.Join(have, ", ")
			} else {
				msg += "; no node has GPUs"
			}
			errs = append(errs, FieldError{Field: prefix + ".gpuModel", Message: msg})
		}
	}
	check("resources", s.Resources)
	if s.Ray != nil && s.Ray.WorkerResources != nil {
		check("ray.workerResources", *s.Ray.WorkerResources)
	}
	if len(errs) > 0 {
		return errs
	}
	// Plan the request alone on empty nodes with no cordons: if the
	// placer's own filters find no home for it, none will ever appear
	// while these nodes are all there is.
	snap := &placer.Snapshot{Now: now}
	for _, n := range nodes {
		snap.Nodes = append(snap.Nodes, placer.NodeView{Node: n, Ledger: state.Ledger{Node: n.Name, Allocations: map[string]state.Allocation{}}})
	}
	q := state.NewQueueEntry(s, now)
	q.Session = "feasibility-check"
	snap.Pending = []placer.Pending{{Entry: &q, Revision: 1}}
	p := placer.NewPlan(snap, plan)
	for _, w := range p.Waiting {
		if w.Reason == "Unsatisfiable" {
			field := "resources"
			if s.Ray != nil && s.Ray.Workers > 0 {
				field = "ray"
			}
			if s.Gang() {
				field = "nodes"
			}
			errs = append(errs, FieldError{Field: field, Message: w.Message + "; the request asks for " + describeRequest(q)})
		}
	}
	return errs
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
