package fence

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// cgroupRoot is a cgroup hierarchy this test may make cgroups in: the
// unified one on a cgroup v2 machine, else v1's pids controller.
func cgroupRoot(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making cgroups needs root") // the keeper runs as root; so does make test
	}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return "/sys/fs/cgroup"
	}
	if _, err := os.Stat("/sys/fs/cgroup/pids/cgroup.procs"); err == nil {
		return "/sys/fs/cgroup/pids"
	}
	t.Fatal("no cgroup v2 and no cgroup v1 pids hierarchy at /sys/fs/cgroup")
	return ""
}

// inCgroup starts script under sh in a new cgroup named id (below a
// parent of this test's own), as containerd puts a container's processes
// in /<namespace>/<id>; it returns the shell's process.
func inCgroup(t *testing.T, root, id, script string) *exec.Cmd {
	t.Helper()
	dir := filepath.Join(root, fmt.Sprintf("voyager-fencetest-%d", os.Getpid()), id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", fmt.Sprintf("echo $$ > %s/cgroup.procs; %s", dir, script))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		// Anything left in the cgroup (a child of the shell) goes too.
		if b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil {
			for _, f := range strings.Fields(string(b)) {
				var pid int
				if _, err := fmt.Sscan(f, &pid); err == nil {
					if p, err := os.FindProcess(pid); err == nil {
						_ = p.Kill()
					}
				}
			}
		}
		<-done
		for i := 0; i < 100 && os.Remove(dir) != nil; i++ {
			time.Sleep(10 * time.Millisecond) // the kernel frees the cgroup once its last process is reaped
		}
		_ = os.Remove(filepath.Dir(dir))
	})
	// Running in the cgroup once the shell moved itself and forked.
	deadline := time.Now().Add(10 * time.Second)
	for {
		procs, err := processes("/proc", map[string]bool{id: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(procs[id]) >= 2 {
			return cmd
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v processes in its cgroup after 10s; want the shell and its child", id, procs[id])
		}
		time.Sleep(10 * time.Millisecond) // polling, bounded by deadline
	}
}

// TestKeeperKillsTheListedContainersOnceTheHeartbeatIsStale: three
// "containers" (cgroups named like containerd's): one whose processes
// ignore SIGTERM, one that ends on it, and one the heartbeat does not list.
// While the heartbeat is fresh the keeper touches nothing; once its
// deadline has passed it records both listed containers and SIGTERMs
// them, SIGKILLs the stubborn one after the grace, and never touches the
// unlisted one.
func TestKeeperKillsTheListedContainersOnceTheHeartbeatIsStale(t *testing.T) {
	root := cgroupRoot(t)
	dir := t.TempDir()
	pid := os.Getpid()
	stubborn := fmt.Sprintf("fencetest-%d-stubborn-q1", pid)
	polite := fmt.Sprintf("fencetest-%d-polite-q2", pid)
	other := fmt.Sprintf("fencetest-%d-other-q3", pid)
	inCgroup(t, root, stubborn, `trap "" TERM; sleep 1000 & wait`)
	inCgroup(t, root, polite, `sleep 1000 & wait`)
	inCgroup(t, root, other, `sleep 1000 & wait`)
	ids := map[string]bool{stubborn: true, polite: true, other: true}

	const grace = 2 * time.Second
	hb := Heartbeat{Node: "gpu-01", PID: pid, Renewed: Now(), Deadline: Now() + int64(time.Hour), Grace: grace,
		Containers: []string{stubborn, polite}}
	if err := WriteHeartbeat(dir, hb); err != nil {
		t.Fatal(err)
	}
	k := &Keeper{Dir: dir, Proc: "/proc", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	w := watch{k: k, termed: map[string]int64{}, recorded: map[string]bool{}}
	for range 3 {
		w.once()
	}
	procs, err := processes("/proc", ids)
	if err != nil {
		t.Fatal(err)
	}
	if len(procs[stubborn]) < 2 || len(procs[polite]) < 2 {
		t.Fatalf("with a fresh heartbeat: %v; want every process alive", procs)
	}
	if _, ok, _ := ReadRecord(dir, polite); ok {
		t.Fatal("a record with a fresh heartbeat")
	}

	hb.Renewed, hb.Deadline = Now()-int64(5*time.Second), Now()-1
	if err := WriteHeartbeat(dir, hb); err != nil {
		t.Fatal(err)
	}
	stale := time.Now()
	var politeGone, stubbornGone time.Duration
	for politeGone == 0 || stubbornGone == 0 {
		w.once()
		procs, err := processes("/proc", ids)
		if err != nil {
			t.Fatal(err)
		}
		if len(procs[polite]) == 0 && politeGone == 0 {
			politeGone = time.Since(stale)
		}
		if len(procs[stubborn]) == 0 && stubbornGone == 0 {
			stubbornGone = time.Since(stale)
		}
		if len(procs[other]) < 2 {
			t.Fatalf("the unlisted container lost processes: %v", procs[other])
		}
		if time.Since(stale) > 10*time.Second {
			t.Fatalf("after 10s stale: %v still run", procs)
		}
		time.Sleep(20 * time.Millisecond) // the keeper's poll interval, shortened
	}
	if stubbornGone < grace {
		t.Errorf("the SIGTERM-ignoring container went after %s, before the grace %s: killed without a SIGTERM first?", stubbornGone, grace)
	}
	if politeGone >= grace {
		t.Errorf("the container that ends on SIGTERM went after %s; want it gone on the SIGTERM, before the grace %s", politeGone, grace)
	}
	for _, id := range []string{stubborn, polite} {
		r, ok, err := ReadRecord(dir, id)
		if err != nil || !ok || r.By != "keeper" || !strings.Contains(r.Cause, "had not renewed the node lease for 5") {
			t.Errorf("record of %s: %+v %v %v; want the keeper's, with the time since the renewal", id, r, ok, err)
		}
	}
	if _, ok, _ := ReadRecord(dir, other); ok {
		t.Error("a record for the unlisted container")
	}
	t.Logf("stale heartbeat: SIGTERM-abiding container gone after %s, SIGTERM-ignoring one after %s (grace %s)",
		politeGone.Round(time.Millisecond), stubbornGone.Round(time.Millisecond), grace)
}

// TestOneKeeperPerDirectory: a second keeper of the same directory exits
// at once with ErrAnotherKeeper; Held says whether one runs.
func TestOneKeeperPerDirectory(t *testing.T) {
	dir := t.TempDir()
	if Held(dir) {
		t.Fatal("held before any keeper ran")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	go func() { done <- (&Keeper{Dir: dir, Logger: quiet}).Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(10 * time.Second)
	for !Held(dir) {
		if time.Now().After(deadline) {
			t.Fatal("the keeper holds no lock after 10s")
		}
		time.Sleep(10 * time.Millisecond) // polling, bounded by deadline
	}
	if err := (&Keeper{Dir: dir, Logger: quiet}).Run(context.Background()); !errors.Is(err, ErrAnotherKeeper) {
		t.Fatalf("second keeper: %v; want ErrAnotherKeeper", err)
	}
}

// TestContainerOf reads the cgroup files of containerd's cgroupfs and
// systemd drivers, on cgroup v1 and v2.
func TestContainerOf(t *testing.T) {
	ids := map[string]bool{"s1-q7": true}
	for _, tc := range []struct {
		name, file, want string
	}{
		{"v1 cgroupfs", "12:pids:/voyager/s1-q7\n11:memory:/voyager/s1-q7\n", "s1-q7"},
		{"v2 cgroupfs", "0::/gpu-01/s1-q7\n", "s1-q7"},
		{"v2 systemd", "0::/system.slice/containerd.service/voyager-cri-containerd-s1-q7.scope\n", "s1-q7"},
		{"another", "0::/voyager/s1-q77\n", ""},
		{"the host", "0::/user.slice/user-0.slice/session-1.scope\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := containerOf([]byte(tc.file), ids); got != tc.want {
				t.Errorf("containerOf(%q) = %q; want %q", tc.file, got, tc.want)
			}
		})
	}
}

// TestParkedHeartbeat: an agent that shut down cleanly where its lease
// cannot expire meanwhile (voyager dev) parks its heartbeat: the keeper
// fences nothing, and a keeper that its agent started exits once that
// agent is gone; a fresh heartbeat of a gone agent does not end it.
func TestParkedHeartbeat(t *testing.T) {
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	k := &Keeper{Dir: dir, Proc: "/proc", ExitWithAgent: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	w := watch{k: k, termed: map[string]int64{}, recorded: map[string]bool{}}
	fresh := Heartbeat{Node: "gpu-01", PID: gone.Process.Pid, Renewed: Now(), Deadline: Now() + int64(time.Hour), Containers: []string{"x-q1"}}
	if err := WriteHeartbeat(dir, fresh); err != nil {
		t.Fatal(err)
	}
	if w.once() {
		t.Fatal("the keeper would exit while a heartbeat is fresh and not parked")
	}
	parked := fresh
	parked.Deadline, parked.Parked = int64(^uint64(0)>>1), true
	if err := WriteHeartbeat(dir, parked); err != nil {
		t.Fatal(err)
	}
	if !w.once() {
		t.Fatal("the keeper would not exit after its agent parked the heartbeat and went")
	}
	if _, ok, _ := ReadRecord(dir, "x-q1"); ok {
		t.Fatal("a parked heartbeat's container was fenced")
	}
}
