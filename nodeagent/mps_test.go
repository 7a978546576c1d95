package nodeagent_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// standInMPS is a stand-in for nvidia-cuda-mps-control, which cannot run
// without an NVIDIA driver: it speaks the part of its protocol the agent
// uses. With -d it starts a daemon in the background that writes its pid
// to nvidia-cuda-mps-control.pid in CUDA_MPS_PIPE_DIRECTORY (as the real
// one does), logs the GPU it was given (CUDA_VISIBLE_DEVICES) to
// CUDA_MPS_LOG_DIRECTORY, and reads commands from a FIFO in the pipe
// directory; without arguments it is a client that passes its stdin to
// that FIFO. "quit" ends the daemon, unless ignoreQuit.
func standInMPS(t *testing.T, ignoreQuit bool) string {
	t.Helper()
	quit := `[ "$cmd" = quit ] && { rm -f "$P/control"; exit 0; }`
	if ignoreQuit {
		quit = `:`
	}
	script := `#!/bin/sh
P="$CUDA_MPS_PIPE_DIRECTORY"; L="$CUDA_MPS_LOG_DIRECTORY"
if [ "$1" = "-d" ]; then
  [ -n "$P" ] && [ -n "$L" ] && [ -n "$CUDA_VISIBLE_DEVICES" ] || exit 2
  rm -f "$P/control"; mkfifo "$P/control" || exit 1
  P="$P" L="$L" sh -c 'trap "" HUP; while :; do read -r cmd < "$P/control"; echo "cmd $cmd" >> "$L/control.log"; ` + quit + `; done' </dev/null >/dev/null 2>&1 &
  echo $! > "$P/nvidia-cuda-mps-control.pid"
  echo "start $CUDA_VISIBLE_DEVICES" >> "$L/control.log"
  exit 0
fi
cat > "$P/control"
`
	bin := filepath.Join(t.TempDir(), "nvidia-cuda-mps-control")
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

func daemonPid(t *testing.T, m *nodeagent.MPS, gpu string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(m.PipeDir(gpu), "nvidia-cuda-mps-control.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

func running(pid int) bool { return pid > 0 && syscall.Kill(pid, 0) == nil }

// killOnCleanup ends whatever daemon m has for gpu when the test ends, on
// every path.
func killOnCleanup(t *testing.T, m *nodeagent.MPS, gpu string) {
	t.Cleanup(func() {
		if pid := daemonPid(t, m, gpu); running(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for running(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("daemon %d still runs", pid)
		}
		time.Sleep(20 * time.Millisecond) // polling the process's exit, with a deadline
	}
}

// TestMPSDaemonPerSharedGPU: the agent starts one control daemon per
// shared GPU with CUDA_VISIBLE_DEVICES set to that GPU and its pipe and log
// directories under its own directory, starts none twice, adopts a daemon
// an earlier agent left (its pid file), and stops (quit) every daemon whose
// GPU no binding holds a fraction of any more, keeping the others. Run
// with a stand-in for nvidia-cuda-mps-control (no GPU here).
func TestMPSDaemonPerSharedGPU(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	m := nodeagent.NewMPS(standInMPS(t, false), dir, nil)
	const g1, g2 = "GPU-aaaa-1", "GPU-bbbb-2"
	killOnCleanup(t, m, g1)
	killOnCleanup(t, m, g2)
	for _, g := range []string{g1, g2} {
		pipe, err := m.Ensure(ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		if pipe != filepath.Join(dir, g, "pipe") {
			t.Errorf("pipe directory %s", pipe)
		}
	}
	p1, p2 := daemonPid(t, m, g1), daemonPid(t, m, g2)
	if !running(p1) || !running(p2) || p1 == p2 {
		t.Fatalf("daemons %d and %d; want one live daemon per GPU", p1, p2)
	}
	if log, _ := os.ReadFile(filepath.Join(m.LogDir(g1), "control.log")); string(log) != "start "+g1+"\n" {
		t.Errorf("GPU 1's daemon log %q; want it started once for %s alone", log, g1)
	}
	if _, err := m.Ensure(ctx, g1); err != nil || daemonPid(t, m, g1) != p1 {
		t.Fatalf("Ensure again: %v, pid %d; want the same daemon %d", err, daemonPid(t, m, g1), p1)
	}
	// A restarted agent adopts the daemons rather than starting more.
	again := nodeagent.NewMPS(m.Binary, dir, nil)
	if _, err := again.Ensure(ctx, g2); err != nil || daemonPid(t, again, g2) != p2 {
		t.Fatalf("a new manager's Ensure: %v, pid %d; want daemon %d adopted", err, daemonPid(t, again, g2), p2)
	}
	if log, _ := os.ReadFile(filepath.Join(m.LogDir(g2), "control.log")); strings.Count(string(log), "start") != 1 {
		t.Errorf("GPU 2's daemon log %q; want one start", log)
	}
	// No binding holds a fraction of GPU 1 any more.
	if err := again.Keep(ctx, map[string]bool{g2: true}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, p1)
	if !running(p2) {
		t.Fatal("Keep stopped the daemon of a GPU still held")
	}
	if log, _ := os.ReadFile(filepath.Join(m.LogDir(g1), "control.log")); !strings.Contains(string(log), "cmd quit") {
		t.Errorf("GPU 1's daemon log %q; want it told to quit", log)
	}
	if err := again.Keep(ctx, nil); err != nil {
		t.Fatal(err)
	}
	waitGone(t, p2)
	if r := again.Running(); len(r) != 0 {
		t.Errorf("running %v after Keep(nil)", r)
	}
}

// TestMPSDaemonKilledWhenItWillNotQuit: a daemon that ignores quit is
// killed once the stop grace passes.
func TestMPSDaemonKilledWhenItWillNotQuit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m := nodeagent.NewMPS(standInMPS(t, true), t.TempDir(), nil)
	m.StopGrace = 500 * time.Millisecond
	const g = "GPU-cccc-3"
	killOnCleanup(t, m, g)
	if _, err := m.Ensure(ctx, g); err != nil {
		t.Fatal(err)
	}
	pid := daemonPid(t, m, g)
	if err := m.Stop(ctx, g); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
}

// TestMPSDaemonThatFailsToStartSaysSo: a control binary that fails names
// itself and its output.
func TestMPSDaemonThatFailsToStartSaysSo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "nvidia-cuda-mps-control")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho 'no NVIDIA driver' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	m := nodeagent.NewMPS(bin, t.TempDir(), nil)
	if _, err := m.Ensure(ctx, "GPU-dddd-4"); err == nil || !strings.Contains(err.Error(), "no NVIDIA driver") || !strings.Contains(err.Error(), "VOYAGER_AGENT_MPS_CONTROL") {
		t.Fatalf("Ensure with a failing binary: %v", err)
	}
}

// TestContainerSpecOfAFraction: a fraction's container gets its limits
// in the MPS client variables (over whatever the session set itself),
// the same in Voyager's own variables, and its GPU's MPS pipe directory
// mounted, the daemon started; on a simulated GPU no daemon, and
// VOYAGER_GPU_SIMULATED says nothing enforces the limits.
func TestContainerSpecOfAFraction(t *testing.T) {
	const gpu = "GPU-eeee-5"
	b := state.Binding{Session: "s", GPUs: []string{gpu}, QueueRevision: 3, MemoryMiB: 1024,
		Share: &state.GPUShare{MemoryMiB: 10240, ComputePercent: 25, GPUMemoryMiB: 81920}}
	sess := state.Session{ID: "s", Owner: "ada", Kind: state.KindBatch, Env: map[string]string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}}

	mps := nodeagent.NewMPS(standInMPS(t, false), t.TempDir(), nil)
	killOnCleanup(t, mps, gpu)
	a := nodeagent.New(nodeagent.Config{Node: node, Image: "img", MPS: mps})
	spec, err := a.ContainerSpec(sess, b, []string{"true"}, "")
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
		"VOYAGER_GPU_SHARE_MIB": "10240", "VOYAGER_GPU_COMPUTE_PERCENT": "25", "CUDA_MPS_PIPE_DIRECTORY": nodeagent.MPSPipePath} {
		if spec.Env[k] != v {
			t.Errorf("%s = %q; want %q", k, spec.Env[k], v)
		}
	}
	if !slices.ContainsFunc(spec.Mounts, func(m runtime.Mount) bool { return m.Target == nodeagent.MPSPipePath && m.Source == mps.PipeDir(gpu) }) {
		t.Errorf("mounts %+v; want the GPU's pipe directory at %s", spec.Mounts, nodeagent.MPSPipePath)
	}
	if !running(daemonPid(t, mps, gpu)) {
		t.Error("no MPS daemon runs for the fraction's GPU")
	}
	if !slices.Equal(spec.CDIDevices, []string{"nvidia.com/gpu=" + gpu}) {
		t.Errorf("CDI devices %v", spec.CDIDevices)
	}

	sim := nodeagent.New(nodeagent.Config{Node: node, Image: "img", Simulated: true})
	spec, err = sim.ContainerSpec(sess, b, []string{"true"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if spec.Env["VOYAGER_GPU_SIMULATED"] != "1" || spec.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=10240M" || spec.Env["CUDA_MPS_PIPE_DIRECTORY"] != "" {
		t.Errorf("simulated: env %v", spec.Env)
	}
}
