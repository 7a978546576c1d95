package runtimetest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"

	"github.com/voyager-gpu/voyager/internal/hostclean"
	"github.com/voyager-gpu/voyager/internal/testreq"
	"github.com/voyager-gpu/voyager/runtime"
)

// EnvAddress names a variable that points the tests at an existing
// containerd socket instead of a private daemon.
const EnvAddress = "VOYAGER_TEST_CONTAINERD_ADDRESS"

// BusyboxPath is where Debian's busybox-static installs its binary.
const BusyboxPath = "/bin/busybox"

// ImageRef is the name BusyboxImage imports the test image under.
const ImageRef = "voyager.local/busybox:test"

var daemon struct {
	once    sync.Once
	addr    string
	missing string // the component whose absence skips the tests
	skip    string // why, and how to get it
	err     error
	d       *runtime.Daemon
	dir     string
	private bool
}

// Main runs the tests of m and then stops the private containerd, if one
// was started, after removing every container the tests left. Use it from
// TestMain: os.Exit(runtimetest.Main(m)).
//
// Before the tests it sweeps what earlier test runs killed midway left on
// the machine (internal/hostclean: only what it can prove is an ended test
// process's), and it labels what these tests create on the host as a
// test's (runtime.EnvHostOwner), so that the next run can sweep it. After
// them it sweeps what the processes they started left (SweepOwn).
func Main(m *testing.M) int {
	SweepLeftovers()
	code := m.Run()
	defer SweepOwn()
	if daemon.d != nil {
		cleanup(daemon.addr)
		_ = daemon.d.Stop(10 * time.Second)
		_ = os.RemoveAll(daemon.dir)
		_ = runtime.ForgetOwner("dir", filepath.Base(daemon.dir))
	}
	return code
}

// Address returns the socket of a containerd for tests: $EnvAddress when
// set, else a private daemon started once per test binary (with its root,
// state and socket under a temporary directory). It skips the test when
// neither is possible (not root, or no containerd binary; a failure instead
// where testreq.Env requires them) and under -short.
// A package that calls it must use Main in its TestMain.
func Address(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs containerd; skipped with -short")
	}
	daemon.once.Do(startDaemon)
	if daemon.missing != "" {
		testreq.Missing(t, daemon.missing, daemon.skip)
	}
	if daemon.err != nil {
		t.Fatal(daemon.err)
	}
	return daemon.addr
}

func startDaemon() {
	if a := os.Getenv(EnvAddress); a != "" {
		daemon.addr = a
		return
	}
	if _, err := exec.LookPath("containerd"); err != nil {
		daemon.missing = "containerd"
		daemon.skip = "containerd is not installed (apt-get install containerd runc), and " + EnvAddress + " is not set: skipping real-containerd tests"
		return
	}
	if os.Geteuid() != 0 {
		daemon.missing = "root"
		daemon.skip = "containerd tests need root to start a private containerd; run as root or set " + EnvAddress
		return
	}
	if _, err := exec.LookPath("runc"); err != nil {
		daemon.missing = "runc"
		daemon.skip = "runc is not installed (apt-get install runc): skipping real-containerd tests"
		return
	}
	dir, err := os.MkdirTemp("", "vctrd")
	if err != nil {
		daemon.err = fmt.Errorf("start containerd: %w", err)
		return
	}
	daemon.dir = dir
	_ = runtime.RecordOwner(runtime.Owner{Kind: "dir", Name: filepath.Base(dir), StateDir: dir})
	d, err := runtime.StartContainerd(context.Background(), dir)
	if err != nil {
		daemon.err = err
		return
	}
	daemon.d, daemon.addr = d, d.Address
}

// cleanup removes every container of every namespace of the daemon at addr:
// their shims would outlive the daemon.
func cleanup(addr string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli, err := containerd.New(addr)
	if err != nil {
		return
	}
	defer cli.Close()
	nss, err := cli.NamespaceService().List(ctx)
	if err != nil {
		return
	}
	for _, ns := range nss {
		nctx := namespaces.WithNamespace(ctx, ns)
		conts, _ := cli.Containers(nctx)
		for _, c := range conts {
			if task, err := c.Task(nctx, nil); err == nil {
				_, _ = task.Delete(nctx, containerd.WithProcessKill)
			}
			_ = c.Delete(nctx, containerd.WithSnapshotCleanup)
		}
		// runc leaves each namespace's parent cgroup behind; remove the
		// empty ones of the test namespaces.
		if strings.HasPrefix(ns, "voyager-test-") {
			dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", ns))
			dirs2, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", ns))
			for _, d := range append(dirs, dirs2...) {
				_ = syscall.Rmdir(d)
			}
		}
		_ = cli.NamespaceService().Delete(ctx, ns)
	}
}

// namespaceSeq makes namespaces unique within a test binary.
var namespaceSeq struct {
	sync.Mutex
	n int
}

// New connects a runtime.Containerd, in a namespace of its own, to the
// test containerd, with the busybox image imported; the connection closes
// and the namespace's containers are removed when t ends.
func New(t testing.TB, opts runtime.ContainerdOptions) *runtime.Containerd {
	t.Helper()
	opts.Address = Address(t)
	if opts.Namespace == "" {
		namespaceSeq.Lock()
		namespaceSeq.n++
		opts.Namespace = fmt.Sprintf("voyager-test-%d-%d", os.Getpid(), namespaceSeq.n)
		namespaceSeq.Unlock()
	}
	ctx := context.Background()
	c, err := runtime.NewContainerd(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		infos, _ := c.List(ctx, nil)
		for _, in := range infos {
			_ = c.Remove(ctx, in.ID)
		}
		if err := c.RemoveNetwork(); err != nil {
			t.Errorf("remove the test network: %v", err)
		}
		_ = c.Close()
	})
	BusyboxImage(t, c)
	return c
}

// BusyboxImage imports the busybox test image (ImageRef) into c, with
// /bin/rendezvous (RendezvousProgram). It skips the test when Debian's
// busybox-static is not installed (see testreq).
func BusyboxImage(t testing.TB, c *runtime.Containerd) string {
	t.Helper()
	if _, err := os.Stat(BusyboxPath); err != nil {
		testreq.Missing(t, "busybox-static", "no "+BusyboxPath+": apt-get install busybox-static to build the test image")
	}
	rdv := RendezvousProgram(t)
	var buf bytes.Buffer
	if err := runtime.WriteBusyboxImage(&buf, BusyboxPath, ImageRef, runtime.ImageFile{Path: "bin/rendezvous", Mode: 0o755, Body: rdv}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Import(context.Background(), &buf); err != nil {
		t.Fatal(err)
	}
	return ImageRef
}

// CreateUnstarted leaves the container of spec as a caller killed between
// creating a container and starting its task would: the container and its
// snapshot exist, with spec's labels, image and args; no task does.
// spec.Image must be the name the image is stored under (ImageRef).
func CreateUnstarted(t testing.TB, c *runtime.Containerd, spec runtime.Spec) {
	t.Helper()
	ctx := context.Background()
	cli, err := containerd.New(c.Address(), containerd.WithDefaultNamespace(c.Namespace()))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	img, err := cli.GetImage(ctx, spec.Image)
	if err != nil {
		t.Fatalf("create unstarted container %s: %v", spec.ID, err)
	}
	if _, err := cli.NewContainer(ctx, spec.ID,
		containerd.WithImage(img),
		containerd.WithNewSnapshot(spec.ID, img),
		containerd.WithContainerLabels(spec.Labels),
		containerd.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs(spec.Args...)),
	); err != nil {
		t.Fatalf("create unstarted container %s: %v", spec.ID, err)
	}
}

var rendezvous struct {
	once sync.Once
	bin  []byte
	err  error
}

// RendezvousProgram returns the test image's /bin/rendezvous, a stand-in
// for torchrun's rendezvous (package ./rendezvous), built static once per
// test binary with the go command that runs the tests.
func RendezvousProgram(t testing.TB) []byte {
	t.Helper()
	rendezvous.once.Do(func() {
		dir, err := os.MkdirTemp("", "vrdv")
		if err != nil {
			rendezvous.err = fmt.Errorf("build the rendezvous stand-in: %w", err)
			return
		}
		defer os.RemoveAll(dir)
		gobin, err := exec.LookPath("go")
		if err != nil {
			rendezvous.err = fmt.Errorf("build the rendezvous stand-in: the go command is not on PATH: %w", err)
			return
		}
		out := filepath.Join(dir, "rendezvous")
		cmd := exec.Command(gobin, "build", "-trimpath", "-o", out, "github.com/voyager-gpu/voyager/runtime/runtimetest/rendezvous")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			rendezvous.err = fmt.Errorf("build the rendezvous stand-in: %w: %s", err, b)
			return
		}
		rendezvous.bin, rendezvous.err = os.ReadFile(out)
	})
	if rendezvous.err != nil {
		t.Fatal(rendezvous.err)
	}
	return rendezvous.bin
}

// SweepLeftovers labels this process's host objects as a test's and removes
// what ended test processes left on the machine (internal/hostclean's
// sweep without All). It only logs failures: a leftover it cannot remove
// must not stop the tests.
func SweepLeftovers() {
	if os.Getenv(runtime.EnvHostOwner) == "" {
		if start, err := runtime.ProcessStart(os.Getpid()); err == nil {
			_ = os.Setenv(runtime.EnvHostOwner, runtime.TestLabel(os.Getpid(), start))
		}
	}
	if os.Geteuid() != 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := hostclean.Sweep(ctx, hostclean.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if len(rep.Removed) > 0 {
		fmt.Fprintf(os.Stderr, "runtimetest: removed %d leftovers of ended test runs: %s\n", len(rep.Removed), strings.Join(rep.Removed, ", "))
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "runtimetest: sweep leftovers of ended test runs: %v\n", err)
	}
}

// SweepOwn removes what the processes this test binary started (agents,
// voyager dev) recorded on the host and left when they ended: simulated
// CDI specs, their containerd namespaces' containers, their networks. A
// test binary calls it once its tests are done (Main does), so that a
// passing run leaves nothing behind.
func SweepOwn() {
	if os.Geteuid() != 0 || os.Getenv(runtime.EnvHostOwner) == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := hostclean.Sweep(ctx, hostclean.Options{Own: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}); err != nil {
		fmt.Fprintf(os.Stderr, "runtimetest: sweep what this test binary's processes left: %v\n", err)
	}
}
