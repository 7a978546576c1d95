package nodeagent_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
	"github.com/voyager-gpu/voyager/state"
)

// writeCDISpec maps the agent's two simulated GPUs, by UUID, to harmless
// host nodes: GPU 0 is /dev/zero seen as /dev/nvidia0, GPU 1 /dev/null
// seen as /dev/nvidia1.
func writeCDISpec(t *testing.T, gpus []state.GPU) string {
	dir := t.TempDir()
	spec := "cdiVersion: \"0.6.0\"\nkind: nvidia.com/gpu\ndevices:\n"
	for i, host := range []string{"/dev/zero", "/dev/null"} {
		spec += fmt.Sprintf("- name: %s\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia%d\n      hostPath: %s\n", gpus[i].UUID, i, host)
	}
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// cgroupMemoryLimit reads the memory limit of process pid's cgroup from
// the host (cgroup v1 or v2).
func cgroupMemoryLimit(t *testing.T, pid uint32) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var p string
		switch {
		case strings.Contains(","+parts[1]+",", ",memory,"):
			p = filepath.Join("/sys/fs/cgroup/memory", parts[2], "memory.limit_in_bytes")
		case parts[0] == "0" && parts[1] == "":
			p = filepath.Join("/sys/fs/cgroup", parts[2], "memory.max")
		default:
			continue
		}
		if v, err := os.ReadFile(p); err == nil {
			return strings.TrimSpace(string(v))
		}
	}
	t.Fatalf("no memory cgroup for pid %d:\n%s", pid, b)
	return ""
}

func TestE2EAgentOnContainerd(t *testing.T) {
	cli := etcdtest.New(t)
	gpus, _ := nodeagent.SimulatedGPUs(node, "2xA100-80GB")
	rt := runtimetest.New(t, runtime.ContainerdOptions{CDISpecDirs: []string{writeCDISpec(t, gpus)}})
	cfg := testConfig(t, cli, rt)
	cfg.Image = runtimetest.ImageRef
	runAgent(t, cfg)
	ctx := context.Background()

	// A notebook (its own command: busybox httpd stands in for Jupyter)
	// on GPU 1, writing a file into its home.
	port := freePort(t)
	serve := "echo kept > $HOME/note && echo hello > /tmp/index.html && exec httpd -f -p $PORT -h /tmp"
	b := bind(t, cli, state.Session{ID: "nb", Owner: "ada", Kind: state.KindNotebook, Command: []string{"sh", "-c", serve},
		Env: map[string]string{"EXPERIMENT": "e2e"}},
		state.Binding{GPUs: []string{gpus[1].UUID}, CPUMilli: 500, MemoryMiB: 200, Ports: []int{port}})
	st := waitPhase(t, cli, "nb", state.PhaseRunning, 30*time.Second)
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/index.html", port))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	full := secretURL(t, cli, "nb", "jupyter")
	if strings.TrimSpace(string(body)) != "hello" || st.URLs["jupyter"] != fmt.Sprintf("http://127.0.0.1:%d/", port) ||
		!strings.HasPrefix(full, fmt.Sprintf("http://127.0.0.1:%d/?token=", port)) {
		t.Fatalf("notebook: %q, status %+v, secret URL %q", body, st, full)
	}
	token := strings.SplitN(full, "token=", 2)[1]
	id := nodeagent.ContainerID(b)
	in, err := rt.Status(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got := cgroupMemoryLimit(t, in.Pid); got != fmt.Sprint(200<<20) {
		t.Errorf("cgroup memory limit %s; want %d", got, 200<<20)
	}
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", in.Pid))
	if err != nil {
		t.Fatal(err)
	}
	env := strings.Split(string(environ), "\x00")
	for _, want := range []string{"EXPERIMENT=e2e", "HOME=/home/jovyan", fmt.Sprintf("PORT=%d", port), "JUPYTER_TOKEN=" + token} {
		if !containsStr(env, want) {
			t.Errorf("environment lacks %q: %q", want, env)
		}
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", in.Pid))
	if strings.Contains(string(cmdline), "JUPYTER_TOKEN") || strings.Contains(string(cmdline), token) {
		t.Errorf("the token is on the command line: %q", cmdline)
	}

	// Stop: the container goes, the port closes, the binding is released.
	s, _, _ := state.Get[state.Session](ctx, cli, keys.Session("nb"))
	s.Desired = state.DesiredStopped
	state.Put(ctx, cli, keys.Session("nb"), s)
	waitPhase(t, cli, "nb", state.PhaseStopped, 30*time.Second)
	waitFor(t, "the notebook container removed", 30*time.Second, func() (bool, string) {
		_, err := rt.Status(ctx, id)
		return err != nil, ""
	})
	if _, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port)); err == nil {
		t.Error("the port still answers after stop")
	}

	// A batch session of the same user: its home holds the notebook's file;
	// it sees exactly its GPU; its exit code comes back.
	script := "cat $HOME/note; ls /dev | grep nvidia; exit 5"
	bind(t, cli, state.Session{ID: "job", Owner: "ada", Kind: state.KindBatch, Command: []string{"sh", "-c", script}},
		state.Binding{GPUs: []string{gpus[0].UUID}, CPUMilli: 500, MemoryMiB: 200})
	st = waitPhase(t, cli, "job", state.PhaseFailed, 30*time.Second)
	if st.ExitCode == nil || *st.ExitCode != 5 || strings.Contains(st.Message, "kept") {
		t.Errorf("batch status: exit %v, message %q; want 5, and no output in the status", st.ExitCode, st.Message)
	}
	logs, _ := filepath.Glob(filepath.Join(cfg.LogDir, "job-q*.log"))
	if len(logs) != 1 {
		t.Fatalf("log files of the job: %v; want one", logs)
	}
	if out, _ := os.ReadFile(logs[0]); string(out) != "kept\nnvidia0\n" {
		t.Errorf("the job's log holds %q; want its output, kept and nvidia0", out)
	}
	waitFor(t, "no containers left", 30*time.Second, func() (bool, string) {
		infos, _ := rt.List(ctx, nil)
		return len(infos) == 0, fmt.Sprint(len(infos))
	})
}

func containsStr(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestE2EDefaultNotebookCommand: a notebook session that names no command
// runs the agent's default (JupyterLab, else Jupyter Server, else `jupyter
// lab`) under sh in a real container: on the busybox image the Jupyter
// stand-in answers its URL. (The Debian Jupyter image's Jupyter Server is
// shown by cmd/voyager's TestJupyterHubE2E.)
func TestE2EDefaultNotebookCommand(t *testing.T) {
	cli := etcdtest.New(t)
	rt := runtimetest.New(t, runtime.ContainerdOptions{})
	cfg := testConfig(t, cli, rt)
	cfg.Image = runtimetest.ImageRef
	runAgent(t, cfg)
	bind(t, cli, state.Session{ID: "nb-default", Owner: "ada", Kind: state.KindNotebook},
		state.Binding{CPUMilli: 500, MemoryMiB: 256, Ports: []int{freePort(t)}})
	st := waitPhase(t, cli, "nb-default", state.PhaseRunning, 30*time.Second)
	resp, err := http.Get(st.URLs["jupyter"])
	if err != nil {
		t.Fatalf("GET %s: %v", st.URLs["jupyter"], err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "stands in") {
		t.Fatalf("GET %s: %d %s", st.URLs["jupyter"], resp.StatusCode, body)
	}
}

// TestE2EAgentStartsAContainerThatNeverStarted: an agent killed between
// creating a session's container and starting its task leaves a container
// with no process. The next agent starts the session's command (afresh)
// rather than report it exited with an unknown code: the job succeeds, and
// its OnFailure restarts are untouched.
func TestE2EAgentStartsAContainerThatNeverStarted(t *testing.T) {
	cli := etcdtest.New(t)
	rt := runtimetest.New(t, runtime.ContainerdOptions{})
	cfg := testConfig(t, cli, rt)
	cfg.Image = runtimetest.ImageRef
	b := bind(t, cli, state.Session{ID: "half", Owner: "ada", Kind: state.KindBatch, Command: []string{"sh", "-c", "echo the-command-ran"},
		Restart: state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 2}}, state.Binding{CPUMilli: 100, MemoryMiB: 64})
	runtimetest.CreateUnstarted(t, rt, runtime.Spec{ID: nodeagent.ContainerID(b), Image: runtimetest.ImageRef, Args: []string{"true"},
		Labels: map[string]string{nodeagent.LabelNode: node, nodeagent.LabelSession: "half"}})

	runAgent(t, cfg)
	var st state.Status
	waitFor(t, "half to end or back off", 60*time.Second, func() (bool, string) {
		var err error
		if st, _, err = state.Get[state.Status](context.Background(), cli, keys.Status("half")); err != nil {
			return false, err.Error()
		}
		return st.Phase.Terminal() || st.Reason == state.ReasonBackOff, string(st.Phase)
	})
	if st.Phase != state.PhaseSucceeded || st.Attempt != 0 || st.ExitCode == nil || *st.ExitCode != 0 {
		t.Fatalf("status %+v; want the session's own command run once, exit 0, attempt 0", st)
	}
	// The output is in the log, never in the status.
	if out, _ := os.ReadFile(filepath.Join(cfg.LogDir, nodeagent.ContainerID(b)+".log")); string(out) != "the-command-ran\n" {
		t.Fatalf("the log holds %q; want the session's own command's output, once", out)
	}
}
