package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/voyager-gpu/voyager/runtime"
)

// A fraction of a shared GPU (state.GPUShare) runs beside other sessions'
// fractions on one physical GPU, so what NVML says of the whole GPU is not
// what the session does: a neighbour's training keeps the GPU at 90% while
// this session's notebook sits idle, and a GPU with no process but this
// session's idle one reads the same as an empty one. Idle culling and the
// unused-GPU flag of a fraction therefore read the session's own processes
// on the GPU: those of NVML's process lists whose host pid belongs to the
// session's container (its cgroup, runtime.ProcessLister).

// ProcessSampler is a GPUSampler that can also sample only one
// container's own processes on GPUs that other containers use too. The
// agent samples a fraction's GPU with it; a GPU held whole is the
// container's alone and sampled whole (SampleGPUs).
type ProcessSampler interface {
	GPUSampler
	// SampleProcesses returns, for each GPU of uuids, the use made of it
	// by containerID's processes only. A GPU it could not read is absent
	// from the map, and the error says why.
	SampleProcesses(ctx context.Context, containerID string, uuids []string) (map[string]GPUSample, error)
}

var (
	_ ProcessSampler = (*NVMLSampler)(nil)
	_ ProcessSampler = (*SimulatedSampler)(nil)
)

// ErrNoProcessLister is returned by NVMLSampler.SampleProcesses when the
// sampler was given no way to list a container's processes.
var ErrNoProcessLister = errors.New("no process lister: a container's own processes on a shared GPU cannot be told apart")

// WithProcesses makes s able to sample a container's own processes
// (SampleProcesses), listing them with pl (the agent's runtime); it
// returns s.
func (s *NVMLSampler) WithProcesses(pl runtime.ProcessLister) *NVMLSampler {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pids = pl
	return s
}

// SampleProcesses reads each GPU of uuids as used by containerID's own
// processes: of NVML's compute processes and MPS clients
// (GetComputeRunningProcesses, GetMPSComputeRunningProcesses) those whose
// pid is the container's count, with the device memory they use; the
// utilisation is the sum of their SM utilisation in the newest per-process
// samples since the previous call (GetProcessUtilization), capped at 100.
// Where the driver keeps no per-process samples (NOT_SUPPORTED), the
// utilisation reads 0 and the container's processes alone say the GPU is
// used: a fraction with a process on its GPU is never flagged unused.
func (s *NVMLSampler) SampleProcesses(ctx context.Context, containerID string, uuids []string) (map[string]GPUSample, error) {
	s.mu.Lock()
	pl := s.pids
	s.mu.Unlock()
	if pl == nil {
		return nil, fmt.Errorf("sample processes of %s: %w", containerID, ErrNoProcessLister)
	}
	// Listed before NVML is read: a process that starts in between is
	// seen at the next sample, one that ended is in neither list.
	pids, err := pl.Pids(ctx, containerID)
	if err != nil {
		return nil, fmt.Errorf("sample processes of %s: %w", containerID, err)
	}
	own := make(map[uint32]bool, len(pids))
	for _, p := range pids {
		own[p] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out, err := s.sampleEach(uuids, func(uuid string) (GPUSample, error) { return s.sampleOwn(containerID, uuid, own) })
	if out == nil {
		return nil, err // NVML did not start
	}
	now := time.Now()
	for k, seen := range s.lastSeen {
		if now.Sub(seen.at) > simForgetAfter {
			delete(s.lastSeen, k) // its container is gone
		}
	}
	return out, err
}

// processSeen is the newest per-process sample time one container's
// sample of one GPU has read (NVML's microseconds), and when.
type processSeen struct {
	ts uint64
	at time.Time
}

// sampleOwn reads GPU uuid as used by the processes in own, those of
// container id. s.mu is held.
func (s *NVMLSampler) sampleOwn(id, uuid string, own map[uint32]bool) (GPUSample, error) {
	var g GPUSample
	d, ret := s.lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("open GPU %s: %s", uuid, s.lib.ErrorString(ret))
	}
	procs, ret := d.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("list processes of GPU %s: %s", uuid, s.lib.ErrorString(ret))
	}
	// Under MPS the compute list shows the MPS server; its clients (the
	// sessions' processes) are listed apart.
	switch mps, ret := d.GetMPSComputeRunningProcesses(); ret {
	case nvml.SUCCESS:
		procs = append(procs, mps...)
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NOT_FOUND:
	default:
		return g, fmt.Errorf("list MPS clients of GPU %s: %s", uuid, s.lib.ErrorString(ret))
	}
	seen := map[uint32]bool{}
	var mem uint64
	for _, p := range procs {
		if !own[p.Pid] || seen[p.Pid] {
			continue
		}
		seen[p.Pid] = true
		g.Processes++
		if p.UsedGpuMemory != math.MaxUint64 { // NVML_VALUE_NOT_AVAILABLE: unknown
			mem += p.UsedGpuMemory
		}
	}
	g.MemoryUsedMiB = int64(mem >> 20)
	// Each container reads the samples since its own last read: the
	// containers sharing a GPU each see every sample once.
	if s.lastSeen == nil {
		s.lastSeen = map[[2]string]processSeen{}
	}
	key := [2]string{id, uuid}
	samples, ret := d.GetProcessUtilization(s.lastSeen[key].ts)
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_NOT_FOUND, nvml.ERROR_NOT_SUPPORTED:
		// No sample since the last read (nothing ran), or none kept.
		s.lastSeen[key] = processSeen{ts: s.lastSeen[key].ts, at: time.Now()}
		return g, nil
	default:
		return g, fmt.Errorf("read process utilisation of GPU %s: %s", uuid, s.lib.ErrorString(ret))
	}
	newest := map[uint32]nvml.ProcessUtilizationSample{}
	last := s.lastSeen[key].ts
	for _, u := range samples {
		last = max(last, u.TimeStamp)
		if !own[u.Pid] {
			continue
		}
		if n, ok := newest[u.Pid]; !ok || u.TimeStamp > n.TimeStamp {
			newest[u.Pid] = u
		}
	}
	s.lastSeen[key] = processSeen{ts: last, at: time.Now()}
	util := 0
	for _, u := range newest {
		util += int(min(u.SmUtil, 100))
	}
	g.UtilizationPercent = min(util, 100)
	return g, nil
}

// SampleProcesses is SampleGPUs: a simulated GPU's use is made up from
// the container's own CPU time, so it is the container's own already.
func (s *SimulatedSampler) SampleProcesses(ctx context.Context, containerID string, uuids []string) (map[string]GPUSample, error) {
	return s.SampleGPUs(ctx, containerID, uuids)
}

// sampleSession samples the GPUs of container id: a fraction's GPU
// (shared) by the container's own processes, which a sampler that cannot
// tell processes apart does not try (a whole-GPU reading would count the
// neighbours' work as the session's); GPUs held whole by their whole
// readings.
func sampleSession(ctx context.Context, s GPUSampler, id string, uuids []string, shared bool) (map[string]GPUSample, error) {
	if !shared {
		return s.SampleGPUs(ctx, id, uuids)
	}
	ps, ok := s.(ProcessSampler)
	if !ok {
		return nil, fmt.Errorf("sample shared GPUs of %s: %T cannot sample a container's own processes", id, s)
	}
	return ps.SampleProcesses(ctx, id, uuids)
}
