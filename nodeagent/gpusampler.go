package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/voyager-gpu/voyager/internal/ctxwait"
	"github.com/voyager-gpu/voyager/runtime"
)

// GPUSample is one GPU's use at one moment.
type GPUSample struct {
	// UtilizationPercent is the share of the last sample period the GPU
	// was busy, 0-100.
	UtilizationPercent int
	// MemoryUsedMiB is device memory in use.
	MemoryUsedMiB int64
	// Processes counts the compute processes on the GPU.
	Processes int
	// Simulated marks numbers made up for a simulated GPU.
	Simulated bool
}

// GPUSampler samples the GPUs given to one container: the agent calls it
// for each running session every Config.ActivityEvery. Implementations
// are safe for concurrent use.
type GPUSampler interface {
	// SampleGPUs returns the use of each GPU of uuids (those bound to
	// container containerID). A GPU it could not read is absent from the
	// map, and the error says why.
	SampleGPUs(ctx context.Context, containerID string, uuids []string) (map[string]GPUSample, error)
}

// NVMLSampler reads real GPUs through NVML: utilisation, memory in use and
// compute processes of each GPU by UUID. A MIG device has no utilisation
// counter of its own: it reports 0%, and its processes tell whether it is
// used.
type NVMLSampler struct {
	lib nvml.Interface

	mu     sync.Mutex
	inited bool
	// pids lists a container's processes for SampleProcesses
	// (gpuprocs.go); nil: it cannot.
	pids runtime.ProcessLister
	// lastSeen is, by container and GPU, the newest per-process sample
	// SampleProcesses read.
	lastSeen map[[2]string]processSeen
}

var _ GPUSampler = (*NVMLSampler)(nil)

// NewNVMLSampler returns a sampler over lib (nvml.New() in production, a
// mock in tests). NVML is initialised at the first sample and stays so
// until Close.
func NewNVMLSampler(lib nvml.Interface) *NVMLSampler { return &NVMLSampler{lib: lib} }

// SampleGPUs reads each GPU of uuids; containerID is not needed, as the
// GPUs are the container's alone. Without a driver it returns ErrNoNVML.
func (s *NVMLSampler) SampleGPUs(_ context.Context, _ string, uuids []string) (map[string]GPUSample, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sampleEach(uuids, s.sample)
}

// sampleEach initialises NVML if it is not yet and reads each GPU of
// uuids with one, keeping the GPUs read and joining the errors of those
// that were not. The caller holds s.mu.
func (s *NVMLSampler) sampleEach(uuids []string, one func(uuid string) (GPUSample, error)) (map[string]GPUSample, error) {
	if !s.inited {
		if err := initNVML(s.lib); err != nil {
			return nil, err
		}
		s.inited = true
	}
	out := make(map[string]GPUSample, len(uuids))
	var errs []error
	for _, uuid := range uuids {
		g, err := one(uuid)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out[uuid] = g
	}
	return out, errors.Join(errs...)
}

func (s *NVMLSampler) sample(uuid string) (GPUSample, error) {
	var g GPUSample
	d, ret := s.lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("open GPU %s: %s", uuid, s.lib.ErrorString(ret))
	}
	switch u, ret := d.GetUtilizationRates(); ret {
	case nvml.SUCCESS:
		g.UtilizationPercent = int(min(u.Gpu, 100))
	case nvml.ERROR_NOT_SUPPORTED: // a MIG device
	default:
		return g, fmt.Errorf("read utilisation of GPU %s: %s", uuid, s.lib.ErrorString(ret))
	}
	m, ret := d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("read memory of GPU %s: %s", uuid, s.lib.ErrorString(ret))
	}
	g.MemoryUsedMiB = int64(m.Used >> 20)
	procs, ret := d.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("list processes of GPU %s: %s", uuid, s.lib.ErrorString(ret))
	}
	g.Processes = len(procs)
	return g, nil
}

// Close shuts NVML down if a sample initialised it.
func (s *NVMLSampler) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.inited {
		return nil
	}
	s.inited = false
	if ret := s.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("shut NVML down: %s", s.lib.ErrorString(ret))
	}
	return nil
}

// SimulatedSampler makes up the use of simulated GPUs, so that idle
// detection can be tried where there are none: a simulated GPU is as busy
// as its container's CPUs (CPU time used since the last sample over the
// wall time, capped at 100%, rounded down; the first sample measures
// 200 ms), with one process while that is above 0% and no memory in use.
// Every sample is marked Simulated.
type SimulatedSampler struct {
	rt runtime.Runtime

	mu   sync.Mutex
	last map[string]cpuReading // by container id
}

type cpuReading struct {
	cpu time.Duration
	at  time.Time
}

var _ GPUSampler = (*SimulatedSampler)(nil)

// simForgetAfter drops the reading of a container not sampled this long
// (it is gone).
const simForgetAfter = 10 * time.Minute

// NewSimulatedSampler returns a sampler that reads containers' CPU time
// from rt.
func NewSimulatedSampler(rt runtime.Runtime) *SimulatedSampler {
	return &SimulatedSampler{rt: rt, last: map[string]cpuReading{}}
}

// simFirstWindow is how long the first sample of a container measures:
// from its start would count the runtime's own work in starting it.
const simFirstWindow = 200 * time.Millisecond

// SampleGPUs gives every GPU of uuids the CPU load of containerID since
// the previous sample; the first sample of a container measures over
// simFirstWindow.
func (s *SimulatedSampler) SampleGPUs(ctx context.Context, containerID string, uuids []string) (map[string]GPUSample, error) {
	s.mu.Lock()
	prev, ok := s.last[containerID]
	s.mu.Unlock()
	if !ok {
		cpu, err := s.rt.CPUUsage(ctx, containerID)
		if err != nil {
			return nil, fmt.Errorf("sample simulated GPUs of %s: %w", containerID, err)
		}
		prev = cpuReading{cpu: cpu, at: time.Now()}
		if !ctxwait.Sleep(ctx, simFirstWindow) {
			return nil, fmt.Errorf("sample simulated GPUs of %s: %w", containerID, ctx.Err())
		}
	}
	cpu, err := s.rt.CPUUsage(ctx, containerID)
	if err != nil {
		return nil, fmt.Errorf("sample simulated GPUs of %s: %w", containerID, err)
	}
	now := time.Now()
	s.mu.Lock()
	s.last[containerID] = cpuReading{cpu: cpu, at: now}
	for id, r := range s.last {
		if now.Sub(r.at) > simForgetAfter {
			delete(s.last, id)
		}
	}
	s.mu.Unlock()
	util := 0
	if wall := now.Sub(prev.at); wall > 0 && cpu > prev.cpu {
		util = int(min(100, int64(cpu-prev.cpu)*100/int64(wall)))
	}
	g := GPUSample{UtilizationPercent: util, Simulated: true}
	if util > 0 {
		g.Processes = 1
	}
	out := make(map[string]GPUSample, len(uuids))
	for _, u := range uuids {
		out[u] = g
	}
	return out, nil
}
