package nodeagent_test

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/state"
)

// migDGX returns go-nvml's DGX A100 mock (as dgx fills it in, but with
// MIG off on GPU 7) with MIG enabled on GPU 0 and that GPU partitioned
// through the mock's own MIG model
// (dgxa100.MIGProfiles): GPU instances of 3, 2, 1 and 1 slices, each with
// a compute instance of all its slices. The mock keeps GPU instances but
// has no MIG device handles, which NVML gives per GPU instance: those are
// filled in from its instances here, with the profile's attributes and a
// UUID per instance, as NVML reports them.
func migDGX(t *testing.T) *dgxa100.Server {
	s := dgx()
	s.Devices[7].(*dgxa100.Device).SetMigMode(nvml.DEVICE_MIG_DISABLE)
	d := s.Devices[0].(*dgxa100.Device)
	if ret, _ := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatalf("enable MIG: %v", ret)
	}
	for _, p := range []int{nvml.GPU_INSTANCE_PROFILE_3_SLICE, nvml.GPU_INSTANCE_PROFILE_2_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE} {
		info, ret := d.GetGpuInstanceProfileInfo(p)
		if ret != nvml.SUCCESS {
			t.Fatalf("profile %d: %v", p, ret)
		}
		gi, ret := d.CreateGpuInstance(&info)
		if ret != nvml.SUCCESS {
			t.Fatalf("create GPU instance: %v", ret)
		}
		ci, ret := gi.GetComputeInstanceProfileInfo(p, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			t.Fatalf("compute profile %d: %v", p, ret)
		}
		if _, ret := gi.CreateComputeInstance(&ci); ret != nvml.SUCCESS {
			t.Fatalf("create compute instance: %v", ret)
		}
	}
	instances := func() []*dgxa100.GpuInstance {
		var gis []*dgxa100.GpuInstance
		for gi := range d.GpuInstances {
			gis = append(gis, gi)
		}
		sort.Slice(gis, func(a, b int) bool { return gis[a].Info.Id < gis[b].Info.Id })
		return gis
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	d.GetMigDeviceHandleByIndexFunc = func(j int) (nvml.Device, nvml.Return) {
		gis := instances()
		if j >= len(gis) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		gi := gis[j]
		prof := dgxa100.MIGProfiles.GpuInstanceProfiles[int(gi.Info.ProfileId)]
		return &mock.Device{
			GetUUIDFunc: func() (string, nvml.Return) {
				return fmt.Sprintf("MIG-%s-gi%d", strings.TrimPrefix(d.UUID, "GPU-"), gi.Info.Id), nvml.SUCCESS
			},
			GetAttributesFunc: func() (nvml.DeviceAttributes, nvml.Return) {
				return nvml.DeviceAttributes{GpuInstanceSliceCount: prof.SliceCount, ComputeInstanceSliceCount: prof.SliceCount,
					MultiprocessorCount: prof.MultiprocessorCount, MemorySizeMB: prof.MemorySizeMB}, nvml.SUCCESS
			},
			GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: prof.MemorySizeMB << 20}, nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	return s
}

// TestInventoryModesOnDGXA100WithMIG reads go-nvml's DGX A100 mock with
// GPU 0 partitioned by the mock's MIG model: GPU 0 is in mode mig with
// its four MIG devices (profiles named as nvidia-smi names them, UUIDs,
// memory), the others whole; sharing all GPUs shares the seven others and
// leaves GPU 0's MIG layout alone, naming GPU 0 says so; and the CDI
// devices the agent checks (and a session is given) are the MIG devices'
// for GPU 0 and the GPU's own for the rest.
func TestInventoryModesOnDGXA100WithMIG(t *testing.T) {
	s := migDGX(t)
	gpus, err := nodeagent.ReadNVML(s)
	if err != nil {
		t.Fatal(err)
	}
	g0 := gpus[0]
	if g0.Mode() != state.GPUModeMIG || len(g0.MIGDevices) != 4 {
		t.Fatalf("GPU 0: mode %s, MIG devices %+v; want mig with 4", g0.Mode(), g0.MIGDevices)
	}
	var profiles []string
	for j, m := range g0.MIGDevices {
		profiles = append(profiles, m.Profile)
		want := fmt.Sprintf("MIG-%s-gi%d", strings.TrimPrefix(g0.UUID, "GPU-"), j)
		if m.UUID != want {
			t.Errorf("MIG device %d UUID %s; want %s", j, m.UUID, want)
		}
	}
	if want := []string{"3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"}; !slices.Equal(profiles, want) {
		t.Errorf("profiles %v; want %v", profiles, want)
	}
	if g0.MIGDevices[0].MemoryMiB != 19968 || g0.MIGDevices[2].MemoryMiB != 4864 {
		t.Errorf("MIG memory %d and %d MiB; want the profiles' 19968 and 4864", g0.MIGDevices[0].MemoryMiB, g0.MIGDevices[2].MemoryMiB)
	}
	for _, g := range gpus[1:] {
		if g.Mode() != state.GPUModeWhole {
			t.Errorf("GPU %d mode %s; want whole", g.Index, g.Mode())
		}
	}

	shared, warnings, err := nodeagent.MarkShared(gpus, nodeagent.SharedAll)
	if err != nil || len(warnings) != 0 {
		t.Fatalf("share all: %v %v", warnings, err)
	}
	if shared[0].Mode() != state.GPUModeMIG || len(shared[0].MIGDevices) != 4 {
		t.Errorf("sharing all changed the MIG GPU: %+v", shared[0])
	}
	for _, g := range shared[1:] {
		if g.Mode() != state.GPUModeShared {
			t.Errorf("GPU %d mode %s after sharing all; want shared", g.Index, g.Mode())
		}
	}
	if gpus[1].Shared {
		t.Error("MarkShared changed its input")
	}
	some, warnings, err := nodeagent.MarkShared(gpus, "0, 3,"+gpus[5].UUID)
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "MIG enabled") || some[0].Shared {
		t.Errorf("naming the MIG GPU: warnings %v, shared %v; want it refused with a warning", warnings, some[0].Shared)
	}
	for i, g := range some {
		if g.Shared != (i == 3 || i == 5) {
			t.Errorf("GPU %d shared %v; want only 3 and 5", i, g.Shared)
		}
	}
	if _, _, err := nodeagent.MarkShared(gpus, "9"); err == nil || !strings.Contains(err.Error(), "no such GPU") {
		t.Errorf("sharing GPU 9 of 8: %v; want an error naming the GPUs there are", err)
	}

	// The CDI devices a session is given, as the agent checks them.
	var asked []string
	nodeagent.CheckCDIDevices(shared, nodeagent.DefaultCDIKind, []string{"/etc/cdi"}, func(devices []string) ([]string, error) {
		asked = devices
		return nil, nil
	})
	want := []string{}
	for _, m := range g0.MIGDevices {
		want = append(want, "nvidia.com/gpu="+m.UUID)
	}
	for _, g := range gpus[1:] {
		want = append(want, "nvidia.com/gpu="+g.UUID)
	}
	if !slices.Equal(asked, want) {
		t.Errorf("CDI devices %v; want %v", asked, want)
	}
}

// TestSimulatedModes: a simulated inventory may share a group of GPUs or
// partition them into MIG devices, and refuses layouts no GPU has.
func TestSimulatedModes(t *testing.T) {
	gpus, err := nodeagent.SimulatedGPUs("n1", "1xA100-80GB,2xA100-80GB/shared,1xA100-80GB/mig=3g.40gb+2g.20gb+1g.10gb+1g.10gb")
	if err != nil {
		t.Fatal(err)
	}
	modes := []string{}
	for _, g := range gpus {
		modes = append(modes, g.Mode())
	}
	if want := []string{"whole", "shared", "shared", "mig"}; !slices.Equal(modes, want) {
		t.Fatalf("modes %v; want %v", modes, want)
	}
	m := gpus[3].MIGDevices
	if len(m) != 4 || m[0].Profile != "3g.40gb" || m[0].MemoryMiB != 40960 || m[2].UUID == m[3].UUID || !strings.HasPrefix(m[0].UUID, "MIG-") {
		t.Fatalf("MIG devices %+v", m)
	}
	again, _ := nodeagent.SimulatedGPUs("n1", "1xA100-80GB,2xA100-80GB/shared,1xA100-80GB/mig=3g.40gb+2g.20gb+1g.10gb+1g.10gb")
	if again[3].MIGDevices[0].UUID != m[0].UUID {
		t.Error("simulated MIG UUIDs must be stable per node")
	}
	for _, bad := range []string{"1xA100-80GB/mig=8g.10gb", "1xA100-80GB/mig=4g.40gb+4g.40gb", "1xA100-40GB/mig=3g.40gb+3g.40gb", "1xA100-80GB/bogus"} {
		if _, err := nodeagent.SimulatedGPUs("n1", bad); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}
