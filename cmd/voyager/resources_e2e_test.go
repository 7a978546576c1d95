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
		if code, out, errOut := runBinaryAs(t, environ, env.httpAddr, admin, args...); code != 0 {
			t.Fatalf("voyager %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
		}
	}
	if code, out, _ := runBinaryAs(t, environ, env.httpAddr, ada, "volume", "list", "-o", "name"); code != 0 || out != "rs-data\nrs-results\n" {
		t.Errorf("voyager volume list as ada: exit %d, %q", code, out)
	}
	if code, _, errOut := runBinaryAs(t, environ, env.httpAddr, ada, "volume", "create", "rs-mine", "--host-path", "/tmp"); code == 0 || !strings.Contains(errOut, "admin") {
		t.Errorf("a user defined a volume: exit %d\n%s", code, errOut)
	}

	script := strings.Join([]string{
		"df -k /dev/shm | tail -n 1",
		"cat /data/train.csv",
		"if touch /data/x 2>/dev/null; then echo ro-written; else echo ro-refused; fi",
		"echo from-first > /results/out && echo rw-written",
	}, "; ")
	code, out, errOut := runBinaryAs(t, environ, env.httpAddr, ada, "run", "--memory", "512", "--shm", "300",
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
	if code, out, errOut := runBinaryAs(t, environ, env.httpAddr, ada, "run", "--volume", "rs-results:/results:ro", "--", "cat", "/results/out"); code != 0 || out != "from-first\n" {
		t.Errorf("ada's second run: exit %d, output %q; want 0, from-first\n%s", code, out, errOut)
	}
	if code, out, _ := runBinaryAs(t, environ, env.httpAddr, bob, "run", "--volume", "rs-results:/results", "--", "sh", "-c", "ls -A /results; cat /results/out"); code == 0 || strings.Contains(out, "from-first") {
		t.Errorf("bob's run: exit %d, output %q; want a failure, without ada's result", code, out)
	}

	// Admission: more shm than memory is refused, saying why.
	if code, _, errOut := runBinaryAs(t, environ, env.httpAddr, ada, "run", "--memory", "512", "--shm", "1024", "--", "true"); code == 0 || !strings.Contains(errOut, "shmMiB") || !strings.Contains(errOut, "memory") {
		t.Errorf("shm above memory: exit %d\n%s", code, errOut)
	}
	if code := dev.stop(); code != 0 {
		t.Errorf("dev exit code %d", code)
	}
}

// TestCLIVolumeAndResourceFlags: `voyager volume` administers volumes,
// `session create` sends --shm, --ulimit and --volume, and `session get`
// shows what was admitted; malformed flags are refused before any request.
func TestCLIVolumeAndResourceFlags(t *testing.T) {
	newCLIEnv(t)
	loginAs(t, "ada")
	if code, _, stderr := voyager(t, "volume", "create", "rs-cli", "--host-path", "/srv/cli/{user}", "--per-user"); code == 0 || !strings.Contains(stderr, "admin") {
		t.Errorf("a user defined a volume: exit %d, %s", code, stderr)
	}
	code, tok, _ := voyager(t, "token", "-sub", "root", "-admin")
	if code != 0 {
		t.Fatal("token")
	}
	t.Setenv(envToken, strings.TrimSpace(tok))
	if code, out, stderr := voyager(t, "volume", "create", "rs-cli", "--host-path", "/srv/cli/{user}", "--per-user", "--groups", "vision"); code != 0 || out != "volume rs-cli: /srv/cli/{user}\n" {
		t.Fatalf("volume create: exit %d, %q, %s", code, out, stderr)
	}
	if code, out, _ := voyager(t, "volume", "list"); code != 0 || !strings.Contains(out, "rs-cli") || !strings.Contains(out, "per-user") || !strings.Contains(out, "group:vision") {
		t.Errorf("volume list: exit %d\n%s", code, out)
	}
	loginAs(t, "ada")
	if code, out, _ := voyager(t, "volume", "list", "-o", "name"); code != 0 || out != "" {
		t.Errorf("ada, not in vision, sees %q", out)
	}
	_, tok, _ = voyager(t, "token", "-sub", "cyd", "-group", "vision")
	t.Setenv(envToken, strings.TrimSpace(tok))
	code, id, stderr := voyager(t, "session", "create", "--kind", "batch", "--memory", "2048", "--shm", "1024",
		"--ulimit", "nofile=4096", "--ulimit", "memlock=unlimited", "--volume", "rs-cli:/results:ro", "-o", "name", "--", "true")
	if code != 0 {
		t.Fatalf("session create: exit %d\n%s", code, stderr)
	}
	code, out, _ := voyager(t, "session", "get", strings.TrimSpace(id))
	for _, want := range []string{"Shared memory:", "1024 MiB", "nofile 4096, memlock unlimited", "Volume rs-cli:", "/results (read-only)"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("session get lacks %q (exit %d):\n%s", want, code, out)
		}
	}
	for _, bad := range [][]string{{"--volume", "rs-cli"}, {"--volume", "rs-cli:/r:rx"}, {"--ulimit", "nofile=many"}, {"--ulimit", "stack=1"}} {
		args := append([]string{"session", "create", "--kind", "batch"}, append(bad, "--", "true")...)
		if code, _, stderr := voyager(t, args...); code == 0 || !strings.Contains(stderr, "invalid "+bad[0]) {
			t.Errorf("%v: exit %d, %s", bad, code, stderr)
		}
	}
}
