package nodeagent

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
)

// ErrNoNVML means NVML is not installed on this machine (no NVIDIA
// driver): the machine has no GPUs Voyager can see.
var ErrNoNVML = errors.New("NVML not found (no NVIDIA driver on this machine)")

// initNVML initialises lib: ErrNoNVML without a driver.
func initNVML(lib nvml.Interface) error {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			return ErrNoNVML
		}
		return fmt.Errorf("init NVML: %s", lib.ErrorString(ret))
	}
	return nil
}

// ReadNVML lists the GPUs of this machine through lib (nvml.New() in
// production, a mock in tests). It initialises and shuts NVML down itself.
// Without a driver it returns ErrNoNVML.
func ReadNVML(lib nvml.Interface) ([]state.GPU, error) {
	if err := initNVML(lib); err != nil {
		return nil, err
	}
	defer lib.Shutdown()
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("count GPUs: %s", lib.ErrorString(ret))
	}
	type dev struct {
		d     nvml.Device
		busID string
	}
	devs := make([]dev, 0, n)
	gpus := make([]state.GPU, 0, n)
	byBus := map[string]int{} // PCI bus id → index in gpus
	for i := 0; i < n; i++ {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("open GPU %d: %s", i, lib.ErrorString(ret))
		}
		g, err := readGPU(lib, i, d)
		if err != nil {
			return nil, err
		}
		bus := ""
		if pci, ret := d.GetPciInfo(); ret == nvml.SUCCESS {
			bus = normBusID(cString(pci.BusId[:]))
			if bus != "" {
				byBus[bus] = len(gpus)
			}
		}
		g.PCIBusID = bus
		devs = append(devs, dev{d, bus})
		gpus = append(gpus, g)
	}
	// NVLink peers are the GPUs at the far end of each active link; links
	// to an NVSwitch name no GPU and add nothing.
	for i, d := range devs {
		seen := map[string]bool{}
		for link := 0; link < nvml.NVLINK_MAX_LINKS; link++ {
			st, ret := d.d.GetNvLinkState(link)
			if ret != nvml.SUCCESS || st != nvml.FEATURE_ENABLED {
				continue
			}
			pci, ret := d.d.GetNvLinkRemotePciInfo(link)
			if ret != nvml.SUCCESS {
				continue
			}
			if j, ok := byBus[normBusID(cString(pci.BusId[:]))]; ok && j != i && !seen[gpus[j].UUID] {
				seen[gpus[j].UUID] = true
				gpus[i].NVLinkPeers = append(gpus[i].NVLinkPeers, gpus[j].UUID)
			}
		}
	}
	return gpus, nil
}

func readGPU(lib nvml.Interface, i int, d nvml.Device) (state.GPU, error) {
	g := state.GPU{Index: i, Healthy: true}
	var ret nvml.Return
	if idx, ret := d.GetIndex(); ret == nvml.SUCCESS {
		g.Index = idx
	}
	if g.UUID, ret = d.GetUUID(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("read UUID of GPU %d: %s", i, lib.ErrorString(ret))
	}
	if g.Model, ret = d.GetName(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("read name of GPU %d: %s", i, lib.ErrorString(ret))
	}
	mem, ret := d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("read memory of GPU %d: %s", i, lib.ErrorString(ret))
	}
	g.MemoryMiB = int64(mem.Total >> 20)
	if major, minor, ret := d.GetCudaComputeCapability(); ret == nvml.SUCCESS {
		g.CUDACompute = major*10 + minor
	}
	if numa, ret := d.GetNumaNodeId(); ret == nvml.SUCCESS {
		g.NUMANode = numa
	}
	// Pages waiting to be retired mean uncorrectable memory errors: the GPU
	// needs a reset before it can be trusted with a session.
	if pending, ret := d.GetRetiredPagesPendingStatus(); ret == nvml.SUCCESS && pending == nvml.FEATURE_ENABLED {
		g.Healthy = false
		g.Problem = "uncorrectable memory errors: pages are waiting to be retired; reset the GPU (nvidia-smi -r, with nothing running on it), then restart the agent"
	}
	current, _, ret := d.GetMigMode()
	if ret == nvml.SUCCESS && current == nvml.DEVICE_MIG_ENABLE {
		g.MIGEnabled = true
		migs, err := readMIG(lib, d)
		if err != nil {
			return g, fmt.Errorf("read MIG devices of GPU %d: %w", i, err)
		}
		g.MIGDevices = migs
	}
	return g, nil
}

func readMIG(lib nvml.Interface, d nvml.Device) ([]state.MIGDevice, error) {
	n, ret := d.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("count MIG devices: %s", lib.ErrorString(ret))
	}
	var out []state.MIGDevice
	for j := 0; j < n; j++ {
		m, ret := d.GetMigDeviceHandleByIndex(j)
		if ret == nvml.ERROR_NOT_FOUND {
			continue // an empty slot
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("open MIG device %d: %s", j, lib.ErrorString(ret))
		}
		uuid, ret := m.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("read UUID of MIG device %d: %s", j, lib.ErrorString(ret))
		}
		attr, ret := m.GetAttributes()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("read attributes of MIG device %d: %s", j, lib.ErrorString(ret))
		}
		mib := int64(attr.MemorySizeMB)
		if mem, ret := m.GetMemoryInfo(); ret == nvml.SUCCESS {
			mib = int64(mem.Total >> 20)
		}
		out = append(out, state.MIGDevice{UUID: uuid, Profile: migProfile(attr), MemoryMiB: mib})
	}
	return out, nil
}

// migProfile names a MIG device's profile as nvidia-smi does: compute
// slices, then memory in GB rounded up ("1g.10gb").
func migProfile(a nvml.DeviceAttributes) string {
	return fmt.Sprintf("%dg.%dgb", a.GpuInstanceSliceCount, (a.MemorySizeMB+1023)/1024)
}

func cString(b []uint8) string {
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// normBusID makes "00000000:07:00.0" and "0000:07:00.0" equal.
func normBusID(s string) string {
	s = strings.ToLower(s)
	if dom, rest, ok := strings.Cut(s, ":"); ok {
		n, err := strconv.ParseUint(dom, 16, 32)
		if err == nil {
			return fmt.Sprintf("%04x:%s", n, rest)
		}
	}
	return s
}

// simulatedCompute is the compute capability of the models a simulated
// inventory may name; others get 0 (unknown).
var simulatedCompute = map[string]int{"V100": 70, "T4": 75, "A100": 80, "A30": 80, "A10": 86, "A40": 86, "L4": 89, "L40": 89, "L40S": 89, "H100": 90, "H200": 90, "GH200": 90, "B200": 100}

var simRE = regexp.MustCompile(`^(\d+)x([A-Za-z0-9]+)-(\d+)GB$`)

// SimulatedGPUs makes up an inventory from a description such as
// "8xA100-80GB" or "4xA100-80GB,2xH100-80GB": for dev and benchmarks on
// machines without GPUs. UUIDs are stable per node name, GPUs split evenly
// over two NUMA nodes and all NVLink to each other (as on an NVSwitch
// machine), with made-up PCI addresses (0000:10:00.0 up) and the compute
// capability of the model where it is known. A group may end in a mode
// (simulatedMode): "/shared" (offered in fractions) or "/mig=<profiles>"
// (partitioned, "2xA100-80GB/mig=3g.40gb+1g.10gb"). The node record must
// be marked Simulated.
func SimulatedGPUs(node, desc string) ([]state.GPU, error) {
	var gpus []state.GPU
	for part := range strings.SplitSeq(desc, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		part, mode, _ := strings.Cut(part, "/")
		m := simRE.FindStringSubmatch(part)
		if m == nil {
			return nil, fmt.Errorf("parse simulated GPUs %q: want <count>x<model>-<memory>GB, such as 8xA100-80GB", part)
		}
		n, _ := strconv.Atoi(m[1])
		gb, _ := strconv.Atoi(m[3])
		if n < 1 || n > 64 || gb < 1 {
			return nil, fmt.Errorf("parse simulated GPUs %q: want 1 to 64 GPUs of at least 1GB", part)
		}
		for range n {
			i := len(gpus)
			sum := sha256.Sum256([]byte(node + "/" + strconv.Itoa(i)))
			g := state.GPU{
				Index:       i,
				UUID:        fmt.Sprintf("GPU-%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16]),
				Model:       fmt.Sprintf("NVIDIA %s-%dGB (simulated)", m[2], gb),
				MemoryMiB:   int64(gb) * 1024,
				Healthy:     true,
				PCIBusID:    fmt.Sprintf("0000:%02x:00.0", 0x10+i),
				CUDACompute: simulatedCompute[strings.ToUpper(m[2])],
			}
			if err := simulatedMode(node, &g, mode); err != nil {
				return nil, fmt.Errorf("parse simulated GPUs %q: %w", part+"/"+mode, err)
			}
			gpus = append(gpus, g)
		}
	}
	for i := range gpus {
		gpus[i].NUMANode = i * 2 / max(len(gpus), 1)
		for j := range gpus {
			if j != i {
				gpus[i].NVLinkPeers = append(gpus[i].NVLinkPeers, gpus[j].UUID)
			}
		}
	}
	return gpus, nil
}

// withholdHeld returns gpus as the agent publishes them: every GPU of
// which a binding in held holds a device in another split than gpus lists
// (the GPU whole while gpus lists it split into MIG devices, or one of its
// MIG devices while gpus lists it whole) carries HeldBy, that binding's
// session, so that no placer offers any device of it while that session
// holds anything on the node. prev is the inventory published before, to
// find the GPU of a held MIG device that gpus no longer lists. gpus is not
// changed; a GPU whose devices no binding holds across splits is returned
// without HeldBy.
func withholdHeld(gpus, prev []state.GPU, held []state.Binding) []state.GPU {
	parent := map[string]string{} // MIG device → its GPU, in either inventory
	for _, inv := range [][]state.GPU{prev, gpus} {
		for _, g := range inv {
			for _, m := range g.MIGDevices {
				parent[m.UUID] = g.UUID
			}
		}
	}
	out := make([]state.GPU, len(gpus))
	copy(out, gpus)
	byUUID := make(map[string]int, len(out))
	for i := range out {
		out[i].HeldBy = ""
		byUUID[out[i].UUID] = i
	}
	for _, b := range held {
		for _, u := range b.GPUs {
			if i, whole := byUUID[u]; whole {
				if out[i].MIGEnabled { // held whole, listed split
					out[i].HeldBy = b.Session
				}
				continue
			}
			if i, ok := byUUID[parent[u]]; ok && !out[i].MIGEnabled { // held split, listed whole
				out[i].HeldBy = b.Session
			}
		}
	}
	return out
}

// splitChanged reports whether some GPU is split otherwise in gpus than
// in prev (MIG turned on or off, other MIG devices), or prev withheld
// one: only then can a binding hold a device across splits.
func splitChanged(gpus, prev []state.GPU) bool {
	before := map[string]state.GPU{}
	for _, g := range prev {
		if g.HeldBy != "" {
			return true
		}
		before[g.UUID] = g
	}
	for _, g := range gpus {
		p, ok := before[g.UUID]
		if !ok || p.MIGEnabled != g.MIGEnabled || len(p.MIGDevices) != len(g.MIGDevices) {
			return ok || g.MIGEnabled
		}
		for j := range g.MIGDevices {
			if p.MIGDevices[j].UUID != g.MIGDevices[j].UUID {
				return true
			}
		}
	}
	return false
}

// offered returns gpus as this agent publishes them (withholdHeld). A
// registration (always) reads the node's bindings for it, and the node
// key an earlier registration may have left (its inventory, to find the
// GPU of a held MIG device no longer listed); a re-check only when gpus
// are split otherwise than prev, the inventory it published before.
// Where they cannot be read, gpus is returned as it is: the placers'
// ledgers still count what is held against each physical GPU.
func (a *Agent) offered(ctx context.Context, gpus, prev []state.GPU, always bool) []state.GPU {
	if !always && !splitChanged(gpus, prev) {
		return gpus
	}
	k := a.cfg.Keys
	resp, err := a.cfg.Client.Txn(ctx).Then(clientv3.OpGet(k.Bindings(a.cfg.Node), clientv3.WithPrefix()), clientv3.OpGet(k.Node(a.cfg.Node))).Commit()
	if err != nil {
		a.log.Warn("read bindings to withhold held GPUs; publishing the inventory as read", "err", err)
		return gpus
	}
	bkvs, nkvs := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	if len(bkvs) == 0 {
		return withholdHeld(gpus, nil, nil)
	}
	if len(nkvs) > 0 {
		if n, err := state.Decode[state.Node](nkvs[0].Value); err == nil {
			prev = append(slices.Clone(prev), n.GPUs...)
		}
	}
	held := make([]state.Binding, 0, len(bkvs))
	for _, kv := range bkvs {
		b, err := state.Decode[state.Binding](kv.Value)
		if err != nil {
			a.log.Warn("ignoring an undecodable binding", "key", string(kv.Key), "err", err)
			continue
		}
		held = append(held, b)
	}
	out := withholdHeld(gpus, prev, held)
	for _, g := range out {
		if g.HeldBy != "" {
			a.log.Info("GPU split otherwise than a session holds it: withheld until that session ends", "gpu", g.UUID, "session", g.HeldBy)
		}
	}
	return out
}
