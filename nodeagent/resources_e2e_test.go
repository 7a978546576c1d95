package nodeagent_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
	"github.com/voyager-gpu/voyager/state"
)

// jobLog returns the log of session id's one container.
func jobLog(t *testing.T, cfg nodeagent.Config, id string) string {
	t.Helper()
	logs, _ := filepath.Glob(filepath.Join(cfg.LogDir, id+"-q*.log"))
	if len(logs) != 1 {
		t.Fatalf("log files of %s: %v; want one", id, logs)
	}
	b, err := os.ReadFile(logs[0])
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestE2EResourcesVolumesAndTopology runs the agent on a real containerd:
// a session's /dev/shm has its shmMiB, its processes its ulimits, its
// GPUs' topology file names exactly its GPUs, and NCCL's topology
// (NCCL_TOPO_FILE) links exactly them, none for a job without GPUs; a per-user volume is created
// owned by the session's user, mode 0700, and what one session writes
// there the next session of the same user reads; a read-only volume
// refuses writes.
func TestE2EResourcesVolumesAndTopology(t *testing.T) {
	cli := etcdtest.New(t)
	gpus, _ := nodeagent.SimulatedGPUs(node, "2xA100-80GB")
	rt := runtimetest.New(t, runtime.ContainerdOptions{CDISpecDirs: []string{writeCDISpec(t, gpus)}})
	cfg := testConfig(t, cli, rt)
	cfg.Image = runtimetest.ImageRef
	runAgent(t, cfg)

	datasets, results := t.TempDir(), filepath.Join(t.TempDir(), "results")
	if err := os.WriteFile(filepath.Join(datasets, "train.csv"), []byte("1,2,3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	uid := uint32(104217)
	vols := []state.VolumeMount{
		{Name: "rs-datasets", MountPath: "/data", ReadOnly: true, HostPath: datasets},
		{Name: "rs-results", MountPath: "/results", HostPath: filepath.Join(results, "ada"), PerUser: true},
	}
	script := strings.Join([]string{
		"df -k /dev/shm | tail -n 1",
		"echo nofile=$(ulimit -n) memlock=$(ulimit -l)",
		"cat /data/train.csv",
		"if touch /data/x 2>/dev/null; then echo ro-written; else echo ro-refused; fi",
		"echo from-first > /results/out",
		"echo nccl=$NCCL_TOPO_FILE",
		"cat $NCCL_TOPO_FILE",
		"echo end-nccl",
		"echo topology=$VOYAGER_GPU_TOPOLOGY",
		"cat $VOYAGER_GPU_TOPOLOGY",
	}, "\n")
	bind(t, cli, state.Session{ID: "rs-first", Owner: "ada", UID: &uid, Kind: state.KindBatch, Command: []string{"sh", "-c", script},
		ShmMiB: 300, Ulimits: &state.Ulimits{MemlockKiB: 2048, Nofile: 4096}, Volumes: vols},
		state.Binding{GPUs: []string{gpus[1].UUID, gpus[0].UUID}, CPUMilli: 500, MemoryMiB: 512})
	st := waitPhase(t, cli, "rs-first", state.PhaseSucceeded, 60*time.Second)
	out := jobLog(t, cfg, "rs-first")
	for _, want := range []string{fmt.Sprintf(" %d ", 300<<10), "nofile=4096 memlock=2048", "1,2,3", "ro-refused", "topology=" + nodeagent.TopologyPath} {
		if !strings.Contains(out, want) {
			t.Errorf("the first job's output lacks %q (status %+v):\n%s", want, st, out)
		}
	}
	// NCCL's topology is in the container, NCCL_TOPO_FILE names it, and
	// it links exactly the two bound GPUs to each other.
	if _, rest, ok := strings.Cut(out, "nccl="+nodeagent.NCCLTopoPath+"\n"); !ok {
		t.Errorf("NCCL_TOPO_FILE is not %s in the job:\n%s", nodeagent.NCCLTopoPath, out)
	} else if x, _, ok := strings.Cut(rest, "end-nccl\n"); !ok {
		t.Errorf("no NCCL topology in the output:\n%s", out)
	} else {
		_, _, links := parseNCCL(t, []byte(x))
		b0, b1 := gpus[0].PCIBusID, gpus[1].PCIBusID
		if fmt.Sprint(links) != fmt.Sprint(map[string][]string{b0: {b1}, b1: {b0}}) {
			t.Errorf("NCCL topology in the container links %v; want %s and %s to each other:\n%s", links, b0, b1, x)
		}
	}
	var top nodeagent.GPUTopology
	if _, js, ok := strings.Cut(out, "topology="+nodeagent.TopologyPath+"\n"); !ok || json.Unmarshal([]byte(js), &top) != nil {
		t.Fatalf("no topology JSON in the output:\n%s", out)
	}
	if !top.Simulated || top.Node != node || len(top.GPUs) != 2 || top.GPUs[0].UUID != gpus[1].UUID || top.GPUs[1].UUID != gpus[0].UUID ||
		fmt.Sprint(top.GPUs[0].NVLinkPeers, top.GPUs[1].NVLinkPeers) != "[1] [0]" {
		t.Errorf("topology %+v; want the two bound GPUs in binding order, NVLink peers of each other, simulated", top)
	}

	fi, err := os.Stat(filepath.Join(results, "ada"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != uid || fi.Mode().Perm() != 0o700 {
		t.Errorf("per-user volume owned by %d, mode %v; want %d, 0700", st.Uid, fi.Mode().Perm(), uid)
	}
	if _, err := os.Stat(filepath.Join(datasets, "x")); err == nil {
		t.Error("the read-only volume was written")
	}

	// The next session of the same user reads what the first wrote.
	bind(t, cli, state.Session{ID: "rs-second", Owner: "ada", UID: &uid, Kind: state.KindBatch, Command: []string{"sh", "-c", "cat /results/out; echo nccl=$NCCL_TOPO_FILE"},
		ShmMiB: 64, Ulimits: &state.Ulimits{MemlockKiB: 64, Nofile: 1024}, Volumes: vols},
		state.Binding{CPUMilli: 500, MemoryMiB: 256})
	waitPhase(t, cli, "rs-second", state.PhaseSucceeded, 60*time.Second)
	if out := jobLog(t, cfg, "rs-second"); out != "from-first\nnccl=\n" {
		t.Errorf("the second job (no GPU) wrote %q; want from-first and no NCCL_TOPO_FILE", out)
	}
	first, _ := filepath.Glob(filepath.Join(cfg.LogDir, "rs-first-q*.gpu-topology.json"))
	second, _ := filepath.Glob(filepath.Join(cfg.LogDir, "rs-second-q*.*topo*"))
	if len(first) != 1 || len(second) != 0 {
		t.Errorf("topology files %v and %v; want one for the job with GPUs, none for the one without", first, second)
	}
}
