package state

import "fmt"

// GPU sharing: a shared GPU (GPU.Shared, set by the node's operator) is
// allocated in fractions of its memory, never whole. A fraction is a
// device of its physical GPU like a MIG device is (devices.go): it
// excludes the GPU held whole and the GPU's MIG devices, and the memory
// of a GPU's fractions sums to at most the GPU's memory. The agent
// enforces each fraction's memory and compute limits (CUDA MPS,
// nodeagent/mps.go).

// GPU modes (GPU.Mode).
const (
	GPUModeWhole  = "whole"  // allocated whole, one session at a time
	GPUModeMIG    = "mig"    // partitioned: its MIG devices are allocated, never the GPU
	GPUModeShared = "shared" // allocated in fractions of its memory, never whole
)

// Mode says how g is allocated: GPUModeMIG when it is partitioned (a MIG
// GPU is never shared), GPUModeShared when its operator shares it,
// GPUModeWhole otherwise.
func (g GPU) Mode() string {
	switch {
	case g.MIGEnabled:
		return GPUModeMIG
	case g.Shared:
		return GPUModeShared
	}
	return GPUModeWhole
}

// GPUShare is a fraction of one shared GPU: held by an allocation
// (Allocation.Share) and enforced by the agent (Binding.Share).
type GPUShare struct {
	// MemoryMiB is the fraction's memory: the most its processes may
	// allocate on the GPU (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT).
	MemoryMiB int64 `json:"memoryMiB"`
	// ComputePercent caps the fraction's share of the GPU's compute
	// (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE); 0: no cap of its own.
	ComputePercent int `json:"computePercent,omitempty"`
	// GPUMemoryMiB is the memory of the whole GPU when it was bound:
	// fair share and quotas count the fraction as MemoryMiB of it, and
	// the fractions of a GPU sum to at most it.
	GPUMemoryMiB int64 `json:"gpuMemoryMiB"`
}

// Fraction reports whether r asks for a fraction of a shared GPU.
func (r Resources) Fraction() bool { return r.GPUShareMiB > 0 }

// Share returns the fraction r asks for of a GPU of gpuMiB memory; nil
// when r asks for no fraction.
func (r Resources) Share(gpuMiB int64) *GPUShare {
	if !r.Fraction() {
		return nil
	}
	return &GPUShare{MemoryMiB: r.GPUShareMiB, ComputePercent: r.GPUComputePercent, GPUMemoryMiB: gpuMiB}
}

// MilliGPUs is what s counts as in thousandths of a GPU: its memory's
// share of the GPU's, or its compute percent where that is larger; at
// least 1.
func (s GPUShare) MilliGPUs() int64 {
	m := int64(s.ComputePercent) * 10
	if s.GPUMemoryMiB > 0 {
		m = max(m, (s.MemoryMiB*1000+s.GPUMemoryMiB-1)/s.GPUMemoryMiB)
	}
	return min(max(m, 1), 1000)
}

// MilliGPUs is what a holds in thousandths of a GPU: 1000 for each device
// held whole (a GPU or a MIG device), its share for a fraction.
func (a Allocation) MilliGPUs() int64 {
	if a.Share != nil && len(a.GPUs) > 0 {
		return a.Share.MilliGPUs()
	}
	return 1000 * int64(len(a.GPUs))
}

// String says s in words: "10240 MiB of a 81920 MiB GPU, 25% compute".
func (s GPUShare) String() string {
	out := fmt.Sprintf("%d MiB of a %d MiB GPU", s.MemoryMiB, s.GPUMemoryMiB)
	if s.ComputePercent > 0 {
		out += fmt.Sprintf(", %d%% compute", s.ComputePercent)
	}
	return out
}

// SharedGPU is what a ledger holds of one shared GPU: the memory of its
// fractions and their holders' owners.
type SharedGPU struct {
	MemoryMiB int64
	Owners    map[string]bool
}

// Fractions returns, per physical GPU, what l's fractions hold of it.
func (l Ledger) Fractions() map[string]SharedGPU {
	out := map[string]SharedGPU{}
	for _, a := range l.Allocations {
		if a.Share == nil {
			continue
		}
		for _, u := range a.GPUs {
			s := out[u]
			if s.Owners == nil {
				s.Owners = map[string]bool{}
			}
			s.MemoryMiB += a.Share.MemoryMiB
			s.Owners[a.Owner] = true
			out[u] = s
		}
	}
	return out
}
