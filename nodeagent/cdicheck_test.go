package nodeagent_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/internal/testlog"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// TestCheckCDIDevicesMarksWhatNoSpecDefines reads go-nvml's simulated DGX
// A100 and checks it against real CDI specs on disk: a GPU whose UUID no
// spec defines (GPU 3, and GPU 0, which the spec names only by its index),
// and a partitioned GPU missing one of its MIG devices (GPU 7), are offered
// unhealthy with a problem naming the device and the fix; GPU 5, unhealthy
// already (retired pages) and missing too, keeps its own problem; the
// others stay healthy, and the inventory passed in is not changed.
func TestCheckCDIDevicesMarksWhatNoSpecDefines(t *testing.T) {
	gpus, err := nodeagent.ReadNVML(dgx())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("cdiVersion: \"0.6.0\"\nkind: nvidia.com/gpu\ndevices:\n")
	device := func(name string, minor int) {
		fmt.Fprintf(&b, "- name: %q\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia%d\n", name, minor)
	}
	device("0", 0)
	for i, g := range gpus {
		if i != 0 && i != 3 && i != 5 && i != 7 {
			device(g.UUID, i)
		}
	}
	device("MIG-7-0", 7)
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	dirs := []string{dir, filepath.Join(dir, "absent")}
	before := fmt.Sprint(gpus)

	out, problems := nodeagent.CheckCDIDevices(gpus, nodeagent.DefaultCDIKind, dirs, func(devices []string) ([]string, error) {
		return runtime.MissingCDIDevices(dirs, devices)
	})

	if fmt.Sprint(gpus) != before {
		t.Error("CheckCDIDevices changed the inventory passed in")
	}
	lacking := map[int]string{0: "nvidia.com/gpu=" + gpus[0].UUID, 3: "nvidia.com/gpu=" + gpus[3].UUID, 5: "nvidia.com/gpu=" + gpus[5].UUID, 7: "nvidia.com/gpu=MIG-7-1"}
	for i, g := range out {
		name, marked := lacking[i]
		switch {
		case i == 5:
			if g.Healthy || !strings.Contains(g.Problem, "retired") {
				t.Errorf("GPU 5: healthy=%v problem %q, want its retired-pages problem kept", g.Healthy, g.Problem)
			}
		case marked:
			if g.Healthy || !strings.Contains(g.Problem, "no CDI device "+name+" in "+strings.Join(dirs, ",")) || !strings.Contains(g.Problem, "nvidia-ctk cdi generate --device-name-strategy=uuid") {
				t.Errorf("GPU %d: healthy=%v problem %q, want unhealthy naming %s and the fix", i, g.Healthy, g.Problem, name)
			}
		default:
			if !g.Healthy || g.Problem != "" {
				t.Errorf("GPU %d: healthy=%v problem %q, want healthy", i, g.Healthy, g.Problem)
			}
		}
	}
	if strings.Contains(out[7].Problem, "MIG-7-0") {
		t.Errorf("GPU 7's problem names MIG-7-0, which the spec defines: %q", out[7].Problem)
	}
	if len(problems) != len(lacking) {
		t.Errorf("problems %q, want one line for each of GPUs 0, 3, 5 and 7", problems)
	}

	// Every device defined: nothing changes.
	all := []string{dir}
	same, problems := nodeagent.CheckCDIDevices([]state.GPU{gpus[1], gpus[2]}, nodeagent.DefaultCDIKind, all, func(devices []string) ([]string, error) {
		return runtime.MissingCDIDevices(all, devices)
	})
	if len(problems) != 0 || !same[0].Healthy || !same[1].Healthy {
		t.Errorf("GPUs the spec defines: %+v, problems %q", same, problems)
	}
}

// TestAgentPublishesGPUHealthAsCDISpecsChange runs an agent on a real etcd
// whose GPUs are checked against a CDI spec directory: with no spec the
// node key offers them unhealthy with the problem; once a spec defining
// one of them is written the agent publishes it healthy, under the same
// lease, without a restart; when the spec goes, unhealthy again; and once
// the key is held by another lease, its publication is refused.
func TestAgentPublishesGPUHealthAsCDISpecsChange(t *testing.T) {
	cli := etcdtest.New(t)
	cfg := testConfig(t, cli, newFake())
	dir := t.TempDir()
	dirs := []string{dir}
	read := cfg.GPUs
	check := func() []state.GPU {
		g, _ := nodeagent.CheckCDIDevices(read, nodeagent.DefaultCDIKind, dirs, func(devices []string) ([]string, error) {
			return runtime.MissingCDIDevices(dirs, devices)
		})
		return g
	}
	cfg.GPUs, cfg.RecheckGPUs, cfg.GPURecheckEvery = check(), check, 50*time.Millisecond
	logs := &testlog.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	runAgent(t, cfg)

	health := func() ([]bool, int64) {
		resp, err := cli.Get(context.Background(), keys.Node(node))
		if err != nil || len(resp.Kvs) == 0 {
			return nil, 0
		}
		n, err := state.Decode[state.Node](resp.Kvs[0].Value)
		if err != nil {
			t.Fatal(err)
		}
		var h []bool
		for _, g := range n.GPUs {
			if !g.Healthy && !strings.Contains(g.Problem, "no CDI device nvidia.com/gpu="+g.UUID) {
				t.Errorf("GPU %s unhealthy with problem %q", g.UUID, g.Problem)
			}
			h = append(h, g.Healthy)
		}
		return h, resp.Kvs[0].Lease
	}
	want := func(what string, healthy ...bool) int64 {
		t.Helper()
		var lease int64
		waitFor(t, what, 10*time.Second, func() (bool, string) {
			h, l := health()
			lease = l
			return fmt.Sprint(h) == fmt.Sprint(healthy), fmt.Sprintf("node's GPUs healthy %v", h)
		})
		return lease
	}
	first := want("both GPUs unhealthy without a spec", false, false)

	spec := fmt.Sprintf("cdiVersion: \"0.6.0\"\nkind: nvidia.com/gpu\ndevices:\n- name: %s\n  containerEdits:\n    deviceNodes:\n    - path: /dev/null\n", read[1].UUID)
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	if lease := want("GPU 1 healthy once a spec defines it", false, true); lease != first {
		t.Errorf("the inventory was published under lease %x, the node registered under %x", lease, first)
	}
	if err := os.Remove(filepath.Join(dir, "nvidia.yaml")); err != nil {
		t.Fatal(err)
	}
	want("GPU 1 unhealthy again once the spec is gone", false, false)

	// The key written since under another lease (as a newer registration
	// would): the agent's next publication is refused, and the key keeps
	// the other lease and value.
	other, err := cli.Grant(context.Background(), 60)
	if err != nil {
		t.Fatal(err)
	}
	const foreign = `{"name":"gpu-01","gpus":[]}`
	if _, err := cli.Put(context.Background(), keys.Node(node), foreign, clientv3.WithLease(other.ID)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the agent's publication refused", 10*time.Second, func() (bool, string) {
		return strings.Contains(logs.String(), "no longer this registration's"), "no refusal logged"
	})
	resp, err := cli.Get(context.Background(), keys.Node(node))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != foreign || resp.Kvs[0].Lease != int64(other.ID) {
		t.Errorf("node key %q under lease %x, want the other registration's %q under %x", resp.Kvs[0].Value, resp.Kvs[0].Lease, foreign, other.ID)
	}
}
