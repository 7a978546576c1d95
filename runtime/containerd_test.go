package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd"

	"github.com/voyager-gpu/voyager/internal/testreq"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
)

// freePort returns a port for a container to publish
// (runtimetest.FreePort: above the ephemeral range, so no other test's
// server is given it).
func freePort(t *testing.T) int {
	t.Helper()
	return runtimetest.FreePort(t)
}

// runBatch starts spec, waits for its exit and returns the exit code and
// the log.
func runBatch(t *testing.T, rt runtime.Runtime, spec runtime.Spec) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if spec.LogPath == "" {
		spec.LogPath = filepath.Join(t.TempDir(), spec.ID+".log")
	}
	if err := rt.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	code, err := rt.Wait(ctx, spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	// Read after the remove: the exit comes back while the shim may
	// still be copying the last output to the log; deleting the task
	// waits for that copy.
	if err := rt.Remove(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(spec.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	return code, string(b)
}

func TestContainerdHTTPServerAnswersOnHostPort(t *testing.T) {
	rt := runtimetest.New(t, runtime.ContainerdOptions{})
	ctx := context.Background()
	port := freePort(t)
	err := rt.Start(ctx, runtime.Spec{
		ID: "web", Image: runtimetest.ImageRef,
		Args: []string{"sh", "-c", fmt.Sprintf("echo hello-from-voyager > /tmp/index.html && exec httpd -f -p 127.0.0.1:%d -h /tmp", port)},
	})
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/index.html", port)
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != "hello-from-voyager" {
				t.Fatalf("GET %s = %d %q", url, resp.StatusCode, body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: no answer within 20s: %v", url, err)
		}
		time.Sleep(50 * time.Millisecond) // polling the port, bounded by deadline
	}
	if err := rt.Stop(ctx, "web", time.Second); err != nil {
		t.Fatal(err)
	}
	if err := rt.Remove(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get(url); err == nil {
		t.Fatalf("GET %s still answers after Stop and Remove", url)
	}
}

func TestContainerdLimitsUserEnvAndConfinement(t *testing.T) {
	rt := runtimetest.New(t, runtime.ContainerdOptions{})
	script := strings.Join([]string{
		"echo uid=$(id -u) gid=$(id -g)",
		"echo mem=$(cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes)",
		"echo pids=$(cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max)",
		"echo cpu=$(cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us)",
		"echo token=$JUPYTER_TOKEN",
		"grep -E '^(NoNewPrivs|Seccomp|CapEff|CapBnd):' /proc/self/status",
		"df -k /dev/shm | tail -n 1",
		"exit 7",
	}, "\n")
	code, out := runBatch(t, rt, runtime.Spec{
		ID: "limits", Image: runtimetest.ImageRef, Args: []string{"sh", "-c", script},
		Env:      map[string]string{"JUPYTER_TOKEN": "s3cret"},
		CPUMilli: 1500, MemoryBytes: 256 << 20, PidsLimit: 99, ShmBytes: 128 << 20,
	})
	if code != 7 {
		t.Errorf("exit code %d; want 7\n%s", code, out)
	}
	for _, want := range []string{
		"uid=1000 gid=100",
		fmt.Sprintf("mem=%d", 256<<20),
		"pids=99",
		"token=s3cret",
		"NoNewPrivs:\t1",
		"Seccomp:\t2",
		"CapEff:\t0000000000000000", // non-root: no effective capabilities
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(out, "cpu=150000") && !strings.Contains(out, "cpu=150000 100000") {
		t.Errorf("CPU quota: want 150000µs per 100000µs:\n%s", out)
	}
	if !strings.Contains(out, " 131072 ") {
		t.Errorf("/dev/shm: want 131072 KiB:\n%s", out)
	}
	// The default capability set, not all of them: CAP_SYS_ADMIN (bit 21) is
	// out of the bounding set.
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, "CapBnd:\t"); ok {
			var bnd uint64
			fmt.Sscanf(v, "%x", &bnd)
			if bnd&(1<<21) != 0 || bnd == 0 {
				t.Errorf("CapBnd %s: want the default set, without CAP_SYS_ADMIN", v)
			}
		}
	}
}

func TestContainerdHomePersistsAcrossContainersOfOneUser(t *testing.T) {
	rt := runtimetest.New(t, runtime.ContainerdOptions{})
	home := filepath.Join(t.TempDir(), "homes", "ada")
	mount := []runtime.Mount{{Source: home, Target: "/home/jovyan", Create: true}}
	code, out := runBatch(t, rt, runtime.Spec{
		ID: "first", Image: runtimetest.ImageRef, Mounts: mount,
		Args: []string{"sh", "-c", "echo kept > /home/jovyan/note && ls -ln /home/jovyan"},
	})
	if code != 0 {
		t.Fatalf("first container: exit %d\n%s", code, out)
	}
	fi, err := os.Stat(home)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != runtime.DefaultUID || st.Gid != runtime.DefaultGID {
		t.Errorf("home owned by %d:%d; want %d:%d", st.Uid, st.Gid, runtime.DefaultUID, runtime.DefaultGID)
	}
	code, out = runBatch(t, rt, runtime.Spec{
		ID: "second", Image: runtimetest.ImageRef, Mounts: mount,
		Args: []string{"cat", "/home/jovyan/note"},
	})
	if code != 0 || strings.TrimSpace(out) != "kept" {
		t.Fatalf("second container: exit %d, output %q; want 0, \"kept\"", code, out)
	}
}

// cdiSpec maps two stand-in GPUs to harmless host nodes.
const cdiSpec = `cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
      hostPath: /dev/zero
- name: "1"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
      hostPath: /dev/null
    env:
    - VOYAGER_CDI_TEST=gpu1
`

func TestContainerdCDIInjectsExactlyTheAssignedDevices(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), []byte(cdiSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	rt := runtimetest.New(t, runtime.ContainerdOptions{CDISpecDirs: []string{dir}})
	list := "ls /dev | grep nvidia; echo env=$VOYAGER_CDI_TEST; head -c 4 /dev/nvidia0 2>/dev/null | wc -c"
	for _, tc := range []struct {
		name    string
		devices []string
		want    []string
	}{
		{"gpu1", []string{"nvidia.com/gpu=1"}, []string{"nvidia1", "env=gpu1", "0"}},
		{"gpu0", []string{"nvidia.com/gpu=0"}, []string{"nvidia0", "env=", "4"}}, // /dev/zero stands in: 4 bytes read
		{"both", []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1"}, []string{"nvidia0", "nvidia1", "env=gpu1", "4"}},
		{"none", nil, []string{"env=", "0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runBatch(t, rt, runtime.Spec{
				ID: "cdi-" + tc.name, Image: runtimetest.ImageRef, CDIDevices: tc.devices,
				Args: []string{"sh", "-c", list},
			})
			got := strings.Fields(out)
			if code != 0 || !slices.Equal(got, tc.want) {
				t.Fatalf("exit %d, output %q; want 0, %q", code, got, tc.want)
			}
		})
	}
	err := rt.Start(context.Background(), runtime.Spec{ID: "cdi-unknown", Image: runtimetest.ImageRef, CDIDevices: []string{"nvidia.com/gpu=7"}})
	if err == nil || !strings.Contains(err.Error(), "nvidia.com/gpu=7") {
		t.Fatalf("Start with an unknown CDI device: %v; want an error naming it", err)
	}
}

func TestContainerdAdoptsAfterReconnect(t *testing.T) {
	rt := runtimetest.New(t, runtime.ContainerdOptions{})
	ctx := context.Background()
	log := filepath.Join(t.TempDir(), "a.log")
	if err := rt.Start(ctx, runtime.Spec{ID: "kept", Image: runtimetest.ImageRef, Args: []string{"sleep", "3600"},
		Labels: map[string]string{"voyager.session": "s1"}, LogPath: log}); err != nil {
		t.Fatal(err)
	}
	in1, _ := rt.Status(ctx, "kept")
	// A second client, as an agent after a restart, sees the same process.
	again := runtimetest.New(t, runtime.ContainerdOptions{Namespace: namespaceOf(t, rt)})
	infos, err := again.List(ctx, map[string]string{"voyager.session": "s1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 1 || infos[0].ID != "kept" || infos[0].Pid != in1.Pid || infos[0].State != runtime.StateRunning || infos[0].LogPath != log {
		t.Fatalf("after reconnect: %+v; want the one running container, pid %d, log %s", infos, in1.Pid, log)
	}
	if _, ok := infos[0].Labels["voyager.runtime/log"]; ok {
		t.Errorf("internal label leaked into Labels: %v", infos[0].Labels)
	}
}

// namespaceOf finds the namespace of a test runtime by its containers.
func namespaceOf(t *testing.T, rt *runtime.Containerd) string {
	t.Helper()
	return rt.Namespace()
}

// TestContainerdRuntimeBinary: the OCI runtime can be replaced (as
// nvidia-container-runtime replaces runc in the NVIDIA_VISIBLE_DEVICES mode);
// here it is runc by its path, and NVIDIA_VISIBLE_DEVICES passes through.
func TestContainerdRuntimeBinary(t *testing.T) {
	runc, err := exec.LookPath("runc")
	if err != nil {
		testreq.Missing(t, "runc", "apt-get install runc")
	}
	rt := runtimetest.New(t, runtime.ContainerdOptions{RuntimeBinary: runc})
	code, out := runBatch(t, rt, runtime.Spec{ID: "rb", Image: runtimetest.ImageRef,
		Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}, Args: []string{"sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES"}})
	if code != 0 || strings.TrimSpace(out) != "GPU-a,GPU-b" {
		t.Fatalf("exit %d, output %q", code, out)
	}
	// The setting is honoured: a runtime that does not exist cannot start.
	bad := runtimetest.New(t, runtime.ContainerdOptions{RuntimeBinary: "/nonexistent/oci-runtime"})
	if err := bad.Start(context.Background(), runtime.Spec{ID: "nope", Image: runtimetest.ImageRef, Args: []string{"true"}}); err == nil {
		t.Fatal("started with a runtime binary that does not exist")
	}
	if infos, _ := bad.List(context.Background(), nil); len(infos) != 0 {
		t.Fatalf("a failed start left %v", infos)
	}
}

// TestContainerdTellsNeverStartedFromGone: a container whose task was never
// created (its creator died between the two steps) is StateCreated, not a
// process that exited with an unknown code; a container whose process ran
// and whose task is gone (deleted, or the machine restarted) is Stopped
// with exit code -1.
func TestContainerdTellsNeverStartedFromGone(t *testing.T) {
	rt := runtimetest.New(t, runtime.ContainerdOptions{})
	ctx := context.Background()
	runtimetest.CreateUnstarted(t, rt, runtime.Spec{ID: "half", Image: runtimetest.ImageRef, Args: []string{"true"},
		Labels: map[string]string{"voyager.session": "s1"}})
	in, err := rt.Status(ctx, "half")
	if err != nil || in.State != runtime.StateCreated {
		t.Fatalf("never-started container: %+v, %v; want state %s", in, err, runtime.StateCreated)
	}
	if in.Labels["voyager.session"] != "s1" {
		t.Errorf("labels %v lost the caller's", in.Labels)
	}

	if err := rt.Start(ctx, runtime.Spec{ID: "ran", Image: runtimetest.ImageRef, Args: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	if code, err := rt.Wait(ctx, "ran"); err != nil || code != 0 {
		t.Fatalf("wait: %d, %v", code, err)
	}
	cli, err := containerd.New(rt.Address(), containerd.WithDefaultNamespace(rt.Namespace()))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	cont, err := cli.LoadContainer(ctx, "ran")
	if err != nil {
		t.Fatal(err)
	}
	task, err := cont.Task(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := task.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	in, err = rt.Status(ctx, "ran")
	if err != nil || in.State != runtime.StateStopped || in.ExitCode != -1 {
		t.Fatalf("container whose task is gone: %+v, %v; want stopped, exit code -1", in, err)
	}
	if len(in.Labels) != 0 {
		t.Errorf("labels %v: the runtime's own marks leaked", in.Labels)
	}
}

// TestContainerdRefusesDeniedEgressOnTheHostNetwork: a container on the
// host's network cannot have its egress denied, so Start refuses the spec
// with the setting that would make it possible, and leaves no container.
func TestContainerdRefusesDeniedEgressOnTheHostNetwork(t *testing.T) {
	rt := runtimetest.New(t, runtime.ContainerdOptions{})
	ctx := context.Background()
	err := rt.Start(ctx, runtime.Spec{ID: "egress-host", Image: runtimetest.ImageRef, Args: []string{"true"}, DenyEgress: true})
	if !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), "VOYAGER_AGENT_NETWORK=isolated") {
		t.Fatalf("Start = %v; want ErrInvalidSpec naming VOYAGER_AGENT_NETWORK=isolated", err)
	}
	if _, err := rt.Status(ctx, "egress-host"); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Status after a refused start = %v; want ErrNotFound", err)
	}
	bad := runtime.Spec{ID: "egress-bad", Image: runtimetest.ImageRef, DenyEgress: true, EgressAllow: []string{"mirror.example.org"}}
	if err := bad.Validate(); !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Fatalf("Validate of a host name as a network = %v; want ErrInvalidSpec", err)
	}
}

// TestContainerdRlimitsAndVolumes: a container's rlimits are what its spec
// asks (ulimit reads them inside), a read-only bind mount refuses writes
// while a read-write one takes them, and a mount whose source is missing
// fails the start with the path named.
func TestContainerdRlimitsAndVolumes(t *testing.T) {
	rt := runtimetest.New(t, runtime.ContainerdOptions{})
	data, results := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(data, "in"), []byte("dataset\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(results, 0o777); err != nil {
		t.Fatal(err)
	}
	script := strings.Join([]string{
		"echo nofile=$(ulimit -n) memlock=$(ulimit -l)",
		"cat /data/in",
		"if echo x > /data/out 2>/dev/null; then echo ro-written; else echo ro-refused; fi",
		"echo result > /results/out && echo rw-written",
		"df -k /dev/shm | tail -n 1",
	}, "\n")
	code, out := runBatch(t, rt, runtime.Spec{
		ID: "rs-rlimits", Image: runtimetest.ImageRef, Args: []string{"sh", "-c", script},
		MemoryBytes: 512 << 20, ShmBytes: 300 << 20,
		// Below any host's hard limits, so granted exactly everywhere.
		Rlimits: []runtime.Rlimit{
			{Type: "RLIMIT_NOFILE", Soft: 4096, Hard: 4096},
			{Type: "RLIMIT_MEMLOCK", Soft: 1024 << 10, Hard: 1024 << 10},
		},
		Mounts: []runtime.Mount{{Source: data, Target: "/data", ReadOnly: true}, {Source: results, Target: "/results"}},
	})
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	for _, want := range []string{"nofile=4096 memlock=1024", "dataset", "ro-refused", "rw-written", fmt.Sprintf(" %d ", 300<<10)} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if b, err := os.ReadFile(filepath.Join(results, "out")); err != nil || string(b) != "result\n" {
		t.Errorf("the read-write mount's file on the host: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(data, "out")); err == nil {
		t.Error("the read-only mount was written on the host")
	}

	missing := filepath.Join(t.TempDir(), "absent")
	err := rt.Start(context.Background(), runtime.Spec{ID: "rs-missing", Image: runtimetest.ImageRef, Args: []string{"true"},
		Mounts: []runtime.Mount{{Source: missing, Target: "/data"}}})
	if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "must exist") {
		t.Errorf("start with a missing mount source: %v; want an error naming %s", err, missing)
	}
	if _, err := rt.Status(context.Background(), "rs-missing"); err == nil {
		t.Error("a container was left by the failed start")
	}
	if err := (runtime.Spec{ID: "x", Image: "i", Rlimits: []runtime.Rlimit{{Type: "RLIMIT_BOGUS"}}}).Validate(); err == nil {
		t.Error("an unknown rlimit type passed Validate")
	}
}

// TestContainerdRlimitsBeyondTheHostsAreCapped: limits above what this
// host may grant (an unprivileged sandbox's root lacks CAP_SYS_RESOURCE)
// start the container with the host's hard limits instead of failing; a
// host with the capability grants them as asked.
func TestContainerdRlimitsBeyondTheHostsAreCapped(t *testing.T) {
	rt := runtimetest.New(t, runtime.ContainerdOptions{})
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	canRaise := false
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			var caps uint64
			fmt.Sscanf(strings.TrimSpace(v), "%x", &caps)
			canRaise = caps&(1<<24) != 0 // CAP_SYS_RESOURCE
		}
	}
	var nofile, memlock syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &nofile); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Getrlimit(8 /* RLIMIT_MEMLOCK */, &memlock); err != nil {
		t.Fatal(err)
	}
	wantNofile, wantMemlock := "1048576", "unlimited"
	if !canRaise {
		wantNofile = fmt.Sprint(min(nofile.Max, 1048576))
		if memlock.Max != ^uint64(0) {
			wantMemlock = fmt.Sprint(memlock.Max >> 10)
		}
	}
	code, out := runBatch(t, rt, runtime.Spec{
		ID: "rs-capped", Image: runtimetest.ImageRef, Args: []string{"sh", "-c", "echo nofile=$(ulimit -n) memlock=$(ulimit -l)"},
		Rlimits: []runtime.Rlimit{
			{Type: "RLIMIT_NOFILE", Soft: 1048576, Hard: 1048576},
			{Type: "RLIMIT_MEMLOCK", Soft: runtime.RlimitInfinity, Hard: runtime.RlimitInfinity},
		},
	})
	if want := "nofile=" + wantNofile + " memlock=" + wantMemlock; code != 0 || strings.TrimSpace(out) != want {
		t.Errorf("exit %d, output %q; want 0 and %q (CAP_SYS_RESOURCE: %v)", code, out, want, canRaise)
	}
}

// TestContainerdPrivateMountIsNeverHandedOver: a private created mount
// (a per-user volume) is made for the container's user when missing, used
// when it is already theirs, and refused, with nothing started, when it
// belongs to someone else; a home (not private) is handed over.
func TestContainerdPrivateMountIsNeverHandedOver(t *testing.T) {
	rt := runtimetest.New(t, runtime.ContainerdOptions{})
	uid := uint32(104217)
	mine := filepath.Join(t.TempDir(), "results", "ada")
	spec := func(id, src string, private bool) runtime.Spec {
		return runtime.Spec{ID: id, Image: runtimetest.ImageRef, UID: &uid, Args: []string{"sh", "-c", "echo ok > /results/f"},
			Mounts: []runtime.Mount{{Source: src, Target: "/results", Create: true, Private: private}}}
	}
	if code, out := runBatch(t, rt, spec("rs-private-new", mine, true)); code != 0 {
		t.Fatalf("a missing private mount: exit %d\n%s", code, out)
	}
	if code, out := runBatch(t, rt, spec("rs-private-own", mine, true)); code != 0 {
		t.Fatalf("the user's own private mount: exit %d\n%s", code, out)
	}
	theirs := t.TempDir() // root's
	err := rt.Start(context.Background(), spec("rs-private-theirs", theirs, true))
	if err == nil || !strings.Contains(err.Error(), "never handed over") {
		t.Errorf("a private mount owned by another uid: %v; want a refusal", err)
	}
	if fi, err := os.Stat(theirs); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("the refused directory changed owner: %v", err)
	}
	if code, out := runBatch(t, rt, spec("rs-home", theirs, false)); code != 0 {
		t.Fatalf("a home handed over: exit %d\n%s", code, out)
	}
}
