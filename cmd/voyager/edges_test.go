package main

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/api"
)

// TestCLIRunOutputBeforeItsEndE2E: voyager run on a real agent prints the
// job's output first, then how it ended, then the summary, on one
// terminal (stdout and stderr interleaved as a person sees them).
func TestCLIRunOutputBeforeItsEndE2E(t *testing.T) {
	needBinary(t)
	env, environ, dev := devWithAgent(t, "voyager-runorder-e2e", "runorder-e2e")
	tok := binaryToken(t, environ, "-sub", "ada")
	for i := range 3 { // the race it mends was seen often, not always
		c := exec.Command(binary, "run", "--cpu", "0.2", "--memory", "256", "--", "sh", "-c", "echo hi-from-the-job; exit 3")
		c.Env = append(environ, envURL+"=http://"+env.httpAddr, envToken+"="+tok)
		var both bytes.Buffer
		c.Stdout, c.Stderr = &both, &both
		_ = c.Run()
		o := both.String()
		out, end, sum := strings.Index(o, "hi-from-the-job"), strings.Index(o, "Failed:"), strings.Index(o, "GPU-hours")
		if c.ProcessState.ExitCode() != 3 || out < 0 || end < out || sum < end {
			t.Errorf("run %d: exit %d; want the output, then Failed:, then the summary:\n%s", i, c.ProcessState.ExitCode(), o)
		}
	}
	if code := dev.stop(); code != 0 {
		t.Errorf("dev exit code %d", code)
	}
}

// TestCLIRoughEdges: what a new user met, each mended.
func TestCLIRoughEdges(t *testing.T) {
	e := newCLIEnv(t)
	startFakeAgent(e)
	loginAs(t, "ada")

	t.Run("session stop takes several IDs", func(t *testing.T) {
		var ids []string
		for range 3 {
			code, out, stderr := voyager(t, "session", "create", "--kind", "batch", "--image", "busybox", "-o", "name", "--", "sleep", "600")
			if code != 0 {
				t.Fatalf("create: %d %s", code, stderr)
			}
			ids = append(ids, strings.TrimSpace(out))
		}
		code, out, stderr := voyager(t, append([]string{"session", "stop"}, ids...)...)
		if code != 0 {
			t.Fatalf("stop %v: exit %d %s", ids, code, stderr)
		}
		for _, id := range ids {
			if !strings.Contains(out, id+": ") {
				t.Errorf("stop output lacks %s:\n%s", id, out)
			}
		}
		code, out, stderr = voyager(t, "session", "stop", ids[0], "no-such-session", "-o", "name")
		if code != exitError || strings.TrimSpace(out) != ids[0] || !strings.Contains(stderr, `no session "no-such-session"`) {
			t.Errorf("stop of one good and one unknown ID: exit %d, %q, %s; want 1, the good one stopped, the other named", code, out, stderr)
		}
	})
	t.Run("a job without GPUs asks for little by default", func(t *testing.T) {
		for _, tc := range []struct {
			gpus        string
			cpu, memory int64
		}{{"0", 500, 1024}, {"1", 1000, 4096}} {
			code, out, stderr := voyager(t, "session", "create", "--kind", "batch", "--image", "busybox", "--gpus", tc.gpus, "-o", "json", "--", "true")
			var v api.SessionView
			if code != 0 || json.Unmarshal([]byte(out), &v) != nil {
				t.Fatalf("create --gpus %s: exit %d %s", tc.gpus, code, stderr)
			}
			if v.Resources.CPUMilli != tc.cpu || v.Resources.MemoryMiB != tc.memory {
				t.Errorf("--gpus %s: defaults %d mCPU, %d MiB; want %d, %d", tc.gpus, v.Resources.CPUMilli, v.Resources.MemoryMiB, tc.cpu, tc.memory)
			}
		}
	})
	t.Run("did you mean", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"sesion", "list"}, "Did you mean this?\n\tsession"},
			{[]string{"session", "stpo", "x"}, "Did you mean this?\n\tstop"},
		} {
			code, _, stderr := voyager(t, tc.args...)
			if code != exitUsage || !strings.Contains(stderr, tc.want) {
				t.Errorf("%v: exit %d, %s; want 2 and %q", tc.args, code, stderr, tc.want)
			}
		}
	})
	t.Run("run without --", func(t *testing.T) {
		code, _, stderr := voyager(t, "run", "sh", "-c", "echo hi")
		if code != exitUsage || !strings.Contains(stderr, "The command to run goes after --") || !strings.Contains(stderr, "voyager run [flags] -- sh -c") {
			t.Errorf("voyager run sh -c: exit %d, %s; want 2 and where the command goes", code, stderr)
		}
	})
	t.Run("volume help", func(t *testing.T) {
		for _, args := range [][]string{{"run", "--help"}, {"session", "create", "--help"}} {
			_, out, _ := voyager(t, args...)
			if !strings.Contains(out, "--volume NAME:/mount/path[:ro]") || strings.Contains(out, "--volume voyager volume list") {
				t.Errorf("%v: --volume help reads:\n%s", args, grepLine(out, "--volume"))
			}
		}
	})
	t.Run("voyager.local in other letters is refused at admission", func(t *testing.T) {
		for _, img := range []string{"VOYAGER.LOCAL/jupyter:latest", "Voyager.Local/busybox"} {
			code, _, stderr := voyager(t, "session", "create", "--image", img)
			if code != exitError || !strings.Contains(stderr, "never pulled") || !strings.Contains(stderr, "voyager.local/") {
				t.Errorf("create with %s: exit %d, %s; want refused, saying to write voyager.local/", img, code, stderr)
			}
		}
		code, out, _ := voyager(t, "session", "list", "-o", "json")
		var list api.SessionList
		_ = code
		if strings.Contains(strings.ToLower(out), "voyager.local/jupyter") {
			t.Errorf("a refused session was written: %s (%v)", out, list)
		}
	})
}

func grepLine(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}
