package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestVolumesAndShmE2E is the experiment runner's data path end to end,
// nothing faked: `voyager dev` with its real agent on a real containerd;
// an admin defines a read-only dataset volume and a per-user results
// volume with `voyager volume create`; `voyager run --shm 300 --volume …`
// sees a 300 MiB /dev/shm, reads the dataset, cannot write it, and writes
// a result that the same user's next run reads, and another user's run
// does not see.
func TestVolumesAndShmE2E(t *testing.T) {
	needBinary(t)
	env, environ, dev := devWithAgent(t, "rs-volumes-e2e", "rs-volumes")

	datasets, results := t.TempDir(), filepath.Join(t.TempDir(), "results")
	if err := os.WriteFile(filepath.Join(datasets, "train.csv"), []byte("1,2,3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(datasets, 0o755); err != nil {
		t.Fatal(err)
	}
	admin := binaryToken(t, environ, "-sub", "root", "-admin")
	ada, bob := binaryToken(t, environ, "-sub", "ada"), binaryToken(t, environ, "-sub", "bob")
	for _, args := range [][]string{
		{"volume", "create", "rs-data", "--host-path", datasets, "--read-only"},
		{"volume", "create", "rs-results", "--host-path", filepath.Join(results, "{user}"), "--per-user"},
	} {
		if code, out, errOut := runBinary(t, environ, env.httpAddr, admin, args...); code != 0 {
			t.Fatalf("voyager %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
		}
	}
	if code, out, _ := runBinary(t, environ, env.httpAddr, ada, "volume", "list", "-o", "name"); code != 0 || out != "rs-data\nrs-results\n" {
		t.Errorf("voyager volume list as ada: exit %d, %q", code, out)
	}
	if code, _, errOut := runBinary(t, environ, env.httpAddr, ada, "volume", "create", "rs-mine", "--host-path", "/tmp"); code == 0 || !strings.Contains(errOut, "admin") {
		t.Errorf("a user defined a volume: exit %d\n%s", code, errOut)
	}

	script := strings.Join([]string{
		"df -k /dev/shm | tail -n 1",
		"cat /data/train.csv",
		"if touch /data/x 2>/dev/null; then echo ro-written; else echo ro-refused; fi",
		"echo from-first > /results/out && echo rw-written",
	}, "; ")
	code, out, errOut := runBinary(t, environ, env.httpAddr, ada, "run", "--memory", "512", "--shm", "300",
		"--volume", "rs-data:/data", "--volume", "rs-results:/results", "--", "sh", "-c", script)
	if code != 0 {
		t.Fatalf("first run: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, want := range []string{fmt.Sprintf(" %d ", 300<<10), "1,2,3", "ro-refused", "rw-written"} {
		if !strings.Contains(out, want) {
			t.Errorf("first run's output lacks %q:\n%s", want, out)
		}
	}
	fi, err := os.Stat(filepath.Join(results, "ada"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid < 100000 || fi.Mode().Perm() != 0o700 {
		t.Errorf("ada's results directory: uid %d, mode %v; want her own uid (100000 or more), 0700", st.Uid, fi.Mode().Perm())
	}

	// The same user's next session reads it; another user's does not see it.
	if code, out, errOut := runBinary(t, environ, env.httpAddr, ada, "run", "--volume", "rs-results:/results:ro", "--", "cat", "/results/out"); code != 0 || out != "from-first\n" {
		t.Errorf("ada's second run: exit %d, output %q; want 0, from-first\n%s", code, out, errOut)
	}
	if code, out, _ := runBinary(t, environ, env.httpAddr, bob, "run", "--volume", "rs-results:/results", "--", "sh", "-c", "ls -A /results; cat /results/out"); code == 0 || strings.Contains(out, "from-first") {
		t.Errorf("bob's run: exit %d, output %q; want a failure, without ada's result", code, out)
	}

	// Admission: more shm than memory is refused, saying why.
	if code, _, errOut := runBinary(t, environ, env.httpAddr, ada, "run", "--memory", "512", "--shm", "1024", "--", "true"); code == 0 || !strings.Contains(errOut, "shmMiB") || !strings.Contains(errOut, "memory") {
		t.Errorf("shm above memory: exit %d\n%s", code, errOut)
	}
	if code := dev.stop(); code != 0 {
		t.Errorf("dev exit code %d", code)
	}
}
