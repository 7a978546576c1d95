package nodeagent_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/voyager-gpu/voyager/nodeagent"
)

// dgx returns go-nvml's simulated DGX A100 with what its mock leaves out
// filled in: PCI bus ids, NUMA nodes, NVLink between pairs (0↔1, 2↔3, …),
// retired-page status (GPU 5 has pages pending) and, on GPU 7, MIG mode with
// two 1g.5gb devices.
func dgx() *dgxa100.Server {
	s := dgxa100.New()
	bus := func(i int) string { return fmt.Sprintf("00000000:%02X:00.0", 0x10+i) }
	for i, d := range s.Devices {
		dev := d.(*dgxa100.Device)
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			copy(p.BusId[:], bus(i))
			return p, nvml.SUCCESS
		}
		dev.GetNumaNodeIdFunc = func() (int, nvml.Return) { return i / 4, nvml.SUCCESS }
		peer := i ^ 1
		dev.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
			if link < 2 {
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		}
		dev.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			if link == 0 {
				copy(p.BusId[:], bus(peer))
			} else {
				copy(p.BusId[:], "00000000:FF:00.0") // an NVSwitch: no GPU there
			}
			return p, nvml.SUCCESS
		}
		dev.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) {
			if i == 5 {
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		}
		dev.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
		dev.GetMigDeviceHandleByIndexFunc = func(j int) (nvml.Device, nvml.Return) {
			if j >= 2 {
				return nil, nvml.ERROR_NOT_FOUND
			}
			return &mock.Device{
				GetUUIDFunc: func() (string, nvml.Return) { return fmt.Sprintf("MIG-%d-%d", i, j), nvml.SUCCESS },
				GetAttributesFunc: func() (nvml.DeviceAttributes, nvml.Return) {
					return nvml.DeviceAttributes{GpuInstanceSliceCount: 1, ComputeInstanceSliceCount: 1, MemorySizeMB: 4864}, nvml.SUCCESS
				},
				GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: 4864 << 20}, nvml.SUCCESS },
			}, nvml.SUCCESS
		}
	}
	s.Devices[7].(*dgxa100.Device).SetMigMode(nvml.DEVICE_MIG_ENABLE)
	return s
}

func TestReadNVMLOfDGXA100(t *testing.T) {
	s := dgx()
	gpus, err := nodeagent.ReadNVML(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != 8 {
		t.Fatalf("%d GPUs; want 8", len(gpus))
	}
	for i, g := range gpus {
		wantUUID, _ := s.Devices[i].GetUUID()
		if g.Index != i || g.UUID != wantUUID || g.Model != "Mock NVIDIA A100-SXM4-40GB" || g.MemoryMiB != 40960 || g.NUMANode != i/4 {
			t.Errorf("GPU %d = %+v", i, g)
		}
		peer, _ := s.Devices[i^1].GetUUID()
		if len(g.NVLinkPeers) != 1 || g.NVLinkPeers[0] != peer {
			t.Errorf("GPU %d NVLink peers %v; want [%s]", i, g.NVLinkPeers, peer)
		}
		if g.Healthy != (i != 5) || (g.Problem == "") != g.Healthy {
			t.Errorf("GPU %d healthy=%v problem %q", i, g.Healthy, g.Problem)
		}
		if g.MIGEnabled != (i == 7) {
			t.Errorf("GPU %d MIG=%v", i, g.MIGEnabled)
		}
	}
	migs := gpus[7].MIGDevices
	if len(migs) != 2 || migs[0].UUID != "MIG-7-0" || migs[0].Profile != "1g.5gb" || migs[0].MemoryMiB != 4864 {
		t.Errorf("GPU 7 MIG devices %+v; want two 1g.5gb", migs)
	}
}

func TestReadNVMLWithoutDriverSaysSo(t *testing.T) {
	lib := &mock.Interface{
		InitFunc:        func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND },
		ErrorStringFunc: func(r nvml.Return) string { return "library not found" },
	}
	_, err := nodeagent.ReadNVML(lib)
	if !errors.Is(err, nodeagent.ErrNoNVML) || !strings.Contains(err.Error(), "no NVIDIA driver") {
		t.Fatalf("ReadNVML without a driver: %v; want ErrNoNVML in plain words", err)
	}
}

// TestReadNVMLOnThisMachine runs the real library: on a machine without a
// driver (CI) it must say so, not crash (the binary links NVML lazily).
func TestReadNVMLOnThisMachine(t *testing.T) {
	gpus, err := nodeagent.ReadNVML(nvml.New())
	switch {
	case errors.Is(err, nodeagent.ErrNoNVML):
		t.Logf("no NVML here: %v", err)
	case err != nil:
		t.Logf("NVML present but failed: %v", err)
	default:
		t.Logf("%d GPUs: %+v", len(gpus), gpus)
	}
}

func TestSimulatedGPUs(t *testing.T) {
	for _, tc := range []struct {
		desc    string
		n       int
		model   string
		mib     int64
		wantErr bool
	}{
		{"8xA100-80GB", 8, "NVIDIA A100-80GB (simulated)", 81920, false},
		{"4xA100-80GB,2xH100-94GB", 6, "NVIDIA A100-80GB (simulated)", 81920, false},
		{"", 0, "", 0, false},
		{"8 A100", 0, "", 0, true},
		{"0xA100-80GB", 0, "", 0, true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			gpus, err := nodeagent.SimulatedGPUs("n1", tc.desc)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v; wantErr %v", err, tc.wantErr)
			}
			if len(gpus) != tc.n {
				t.Fatalf("%d GPUs; want %d", len(gpus), tc.n)
			}
			if tc.n == 0 {
				return
			}
			seen := map[string]bool{}
			for _, g := range gpus {
				if seen[g.UUID] || !g.Healthy || len(g.NVLinkPeers) != tc.n-1 {
					t.Errorf("GPU %+v", g)
				}
				seen[g.UUID] = true
			}
			if gpus[0].Model != tc.model || gpus[0].MemoryMiB != tc.mib || gpus[tc.n-1].NUMANode != 1 {
				t.Errorf("first GPU %+v, last NUMA %d", gpus[0], gpus[tc.n-1].NUMANode)
			}
			again, _ := nodeagent.SimulatedGPUs("n1", tc.desc)
			other, _ := nodeagent.SimulatedGPUs("n2", tc.desc)
			if again[0].UUID != gpus[0].UUID || other[0].UUID == gpus[0].UUID {
				t.Error("simulated UUIDs must be stable per node and differ between nodes")
			}
		})
	}
}
