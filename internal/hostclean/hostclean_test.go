package hostclean_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coreos/go-iptables/iptables"

	"github.com/voyager-gpu/voyager/internal/hostclean"
	"github.com/voyager-gpu/voyager/internal/testreq"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
)

func TestMain(m *testing.M) { os.Exit(runtimetest.Main(m)) }

// envVictim makes TestVictim run: the process a test kills with -9 while
// it holds every kind of host object the suite makes.
const envVictim = "HOSTCLEAN_VICTIM_DIR"

// TestVictim is not a test of its own: TestSweepAfterKilledRun runs the
// test binary with envVictim set and this test selected, and kills it once
// it has written "ready" in that directory. It holds, as the suite's tests
// do: a private containerd with a running container on an isolated network
// (bridge, chains, CNI records, a pinned network namespace) and a named
// network namespace and bridge made with ip.
func TestVictim(t *testing.T) {
	dir := os.Getenv(envVictim)
	if dir == "" {
		t.Skip("run by TestSweepAfterKilledRun only")
	}
	tag := filepath.Base(dir)
	rt := runtimetest.New(t, runtime.ContainerdOptions{Network: runtime.NetworkOptions{
		Mode: runtime.NetworkIsolated, Name: "vyhc-" + tag, StateDir: filepath.Join(dir, "net"),
	}})
	ctx := context.Background()
	if err := rt.Start(ctx, runtime.Spec{ID: "sleeper", Image: runtimetest.ImageRef, Args: []string{"sleep", "3600"}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][]string{{"netns", "add", "vyhc-" + tag}, {"link", "add", "vyhb" + tag, "type", "bridge"}} {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", c, err, out)
		}
	}
	_ = runtime.RecordOwner(runtime.Owner{Kind: "netns", Name: "vyhc-" + tag})
	_ = runtime.RecordOwner(runtime.Owner{Kind: "link", Name: "vyhb" + tag})
	if err := os.WriteFile(filepath.Join(dir, "ready"), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		t.Fatal(err)
	}
	select {} // until killed
}

// leftovers lists the host objects a victim tagged tag leaves, as found
// on the machine now.
func leftovers(t *testing.T, tag string, pid int) []string {
	t.Helper()
	var found []string
	sum := sha256.Sum256([]byte("vyhc-" + tag))
	id := hex.EncodeToString(sum[:3])
	links, _ := exec.Command("ip", "-o", "link", "show").Output()
	for _, name := range []string{"vy" + id, "vyhb" + tag} {
		if strings.Contains(string(links), " "+name+":") {
			found = append(found, "bridge "+name)
		}
	}
	nss, _ := exec.Command("ip", "netns", "list").Output()
	if strings.Contains(string(nss), "vyhc-"+tag) {
		found = append(found, "netns vyhc-"+tag)
	}
	ipt, err := iptables.New()
	if err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"filter", "nat"} {
		chains, _ := ipt.ListChains(table)
		for _, c := range chains {
			if strings.HasPrefix(c, "VY"+id) {
				found = append(found, "chain "+table+"/"+c)
			}
		}
	}
	root := filepath.Join(hostclean.RuncRoot, fmt.Sprintf("voyager-test-%d-1", pid))
	if out, _ := exec.Command("runc", "--root", root, "list", "-q").Output(); len(strings.TrimSpace(string(out))) > 0 {
		found = append(found, "containers "+strings.Join(strings.Fields(string(out)), ","))
	}
	owners, _ := runtime.Owners()
	for _, o := range owners {
		if strings.Contains(o.Name, tag) {
			found = append(found, "owner record "+o.Kind+" "+o.Name)
		}
	}
	return found
}

// killedVictim runs TestVictim in a process of its own, waits until it
// holds its objects, kills it with -9 and returns its tag and pid.
func killedVictim(t *testing.T) (string, int) {
	return killedVictimLabelled(t, false)
}

// killedVictimLabelled is killedVictim; with child, the victim keeps this
// test binary's label (runtime.EnvHostOwner), as the agents and voyager dev
// processes a test starts do.
func killedVictimLabelled(t *testing.T, child bool) (string, int) {
	t.Helper()
	if os.Geteuid() != 0 {
		testreq.Missing(t, "root", "the sweep test makes networks and containers: run as root")
	}
	runtimetest.Address(t) // skips or fails as the suite does without containerd
	dir, err := os.MkdirTemp("", "vhc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	tag := filepath.Base(dir)[3:]
	if err := os.Rename(dir, filepath.Join(filepath.Dir(dir), tag)); err != nil {
		t.Fatal(err)
	}
	dir = filepath.Join(filepath.Dir(dir), tag)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	cmd := exec.Command(os.Args[0], "-test.run=^TestVictim$", "-test.v")
	// The victim is a test binary of its own (its own label), not a process
	// of this one: what it leaves is an ended test binary's.
	var env []string
	for _, e := range os.Environ() {
		if child || !strings.HasPrefix(e, runtime.EnvHostOwner+"=") {
			env = append(env, e)
		}
	}
	cmd.Env = append(env, envVictim+"="+dir)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if _, err := os.Stat(filepath.Join(dir, "ready")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("the victim did not get ready in 3 minutes:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	// Whatever a test below leaves of the victim (its daemon's directory
	// when Match keeps the sweep off it) goes with the ended-run sweep.
	t.Cleanup(func() { _, _ = hostclean.Sweep(context.Background(), hostclean.Options{}) })
	return tag, cmd.Process.Pid
}

// TestSweepAfterKilledRun kills a test process with -9 while it holds a
// container, an isolated network and named network objects, shows that
// they are left behind, and that the sweep every test binary runs at its
// start (hostclean.Sweep without All) removes every one of them: their
// recorder has ended.
func TestSweepAfterKilledRun(t *testing.T) {
	tag, pid := killedVictim(t)
	before := leftovers(t, tag, pid)
	if len(before) < 5 {
		t.Fatalf("a killed run left only %v; want its container, bridges, chains, netns and records (or the test proves nothing)", before)
	}
	rep, err := hostclean.Sweep(context.Background(), hostclean.Options{})
	if err != nil {
		t.Errorf("sweep: %v", err)
	}
	if after := leftovers(t, tag, pid); len(after) > 0 {
		t.Fatalf("after the sweep these remain: %v (it removed %v)", after, rep.Removed)
	}
	t.Logf("a killed run left %d objects; the sweep removed them: %v", len(before), rep.Removed)
}

// TestCleanHostRemovesEverything is make clean-host's sweep (All), held to
// one killed victim's objects by Match so that it leaves the tests running
// beside it alone: everything goes, records or not (the records are
// removed first, so it must find the objects by their names).
func TestCleanHostRemovesEverything(t *testing.T) {
	tag, pid := killedVictim(t)
	sum := sha256.Sum256([]byte("vyhc-" + tag))
	id := hex.EncodeToString(sum[:3])
	owners, _ := runtime.Owners()
	for _, o := range owners {
		if strings.Contains(o.Name, tag) && o.Kind != "network" {
			_ = runtime.ForgetOwner(o.Kind, o.Name)
		}
	}
	ns := fmt.Sprintf("voyager-test-%d-1", pid)
	match := func(name string) bool {
		return strings.Contains(name, tag) || strings.HasPrefix(name, "VY"+id) || name == "vy"+id || name == ns
	}
	rep, err := hostclean.Sweep(context.Background(), hostclean.Options{All: true, Match: match})
	if err != nil {
		t.Errorf("clean-host sweep: %v", err)
	}
	if after := leftovers(t, tag, pid); len(after) > 0 {
		t.Fatalf("after the clean-host sweep these remain: %v (it removed %v)", after, rep.Removed)
	}
}

// TestSweepOwnAfterAChildEnded: what a process this test binary started
// left (it carries this binary's label) is no ended test binary's, so the
// sweep at a run's start leaves it; the sweep a test binary runs when its
// tests are done (Own) removes it, its recorder having ended.
func TestSweepOwnAfterAChildEnded(t *testing.T) {
	tag, pid := killedVictimLabelled(t, true)
	before := leftovers(t, tag, pid)
	if len(before) < 5 {
		t.Fatalf("a killed child left only %v; want its container, bridges, chains, netns and records", before)
	}
	// Its containerd namespace (voyager-test-<pid>-1) names the child's
	// ended pid, so that goes at once; the records need Own.
	if _, err := hostclean.Sweep(context.Background(), hostclean.Options{}); err != nil {
		t.Errorf("sweep: %v", err)
	}
	if owners, _ := runtime.Owners(); !slices.ContainsFunc(owners, func(o runtime.Owner) bool { return strings.Contains(o.Name, tag) }) {
		t.Fatal("the sweep of ended test binaries removed what a live test binary's child recorded")
	}
	rep, err := hostclean.Sweep(context.Background(), hostclean.Options{Own: true})
	if err != nil {
		t.Errorf("sweep (Own): %v", err)
	}
	if after := leftovers(t, tag, pid); len(after) > 0 {
		t.Fatalf("after the Own sweep these remain: %v (it removed %v)", after, rep.Removed)
	}
}

// TestSweepRemovesStaleShimSockets: a shim killed before it removed its
// socket leaves the file behind (three a make test run accumulated on a
// test machine). Sweep removes a socket nothing listens on once it is a
// minute old, and leaves a live one, and a stale one younger than that,
// alone.
func TestSweepRemovesStaleShimSockets(t *testing.T) {
	dir := t.TempDir()
	defer func(old string) { hostclean.ShimSocketRoot = old }(hostclean.ShimSocketRoot)
	hostclean.ShimSocketRoot = dir
	listen := func(name string) *net.UnixListener {
		l, err := net.Listen("unix", filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return l.(*net.UnixListener)
	}
	live := listen("live")
	defer live.Close()
	for _, name := range []string{"stale", "young"} {
		l := listen(name)
		l.SetUnlinkOnClose(false) // as a killed shim leaves it
		_ = l.Close()
	}
	old := time.Now().Add(-2 * time.Minute)
	for _, name := range []string{"live", "stale"} {
		if err := os.Chtimes(filepath.Join(dir, name), old, old); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := hostclean.Sweep(context.Background(), hostclean.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Logf("sweep: %v", err) // other leftovers' failures are not this test's
	}
	if _, err := os.Stat(filepath.Join(dir, "stale")); !os.IsNotExist(err) {
		t.Errorf("the stale socket is still there (%v), want it removed", err)
	}
	if !slices.Contains(rep.Removed, "shim socket "+filepath.Join(dir, "stale")) {
		t.Errorf("report %v, want the stale socket named", rep.Removed)
	}
	for _, name := range []string{"live", "young"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("%s socket: %v, want it left alone", name, err)
		}
	}
}
