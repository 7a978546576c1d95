package hostclean

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coreos/go-iptables/iptables"

	"github.com/voyager-gpu/voyager/runtime"
)

// Options tune Sweep.
type Options struct {
	// All removes every Voyager object on the machine, whoever made it and
	// whether or not it is in use (make clean-host). Off, only what an
	// ended test process left.
	All bool
	// Own, without All, also removes what processes this one started
	// (agents, voyager dev, under its runtime.EnvHostOwner label) recorded
	// and left: those whose recorder has ended. A test binary sets it when
	// its tests are done.
	Own bool
	// Match, when set, limits the sweep to objects whose name it accepts:
	// a test sweeping only what it made itself.
	Match func(name string) bool
	// Logger receives what is removed. Default slog.Default().
	Logger *slog.Logger
}

// Report lists what a sweep removed, as "kind name", in the order removed.
type Report struct {
	Removed []string
}

// The places Voyager's objects live on a machine.
var (
	// RuncRoot holds one runc state directory per containerd namespace.
	RuncRoot = "/run/containerd/runc"
	// TaskRoot holds the shims' bundles (with the rootfs mounts) per namespace.
	TaskRoot = "/run/containerd/io.containerd.runtime.v2.task"
	// NetStateRoot is runtime.NetworkOptions' default StateDir parent.
	NetStateRoot = "/run/voyager/net"
	// CDIRoot holds the agents' simulated CDI specs.
	CDIRoot = "/run/voyager/cdi"
	// ShimSocketRoot holds the containerd shims' sockets: containerd's
	// shims put theirs there whatever the daemon's state directory, a
	// test's private daemon's too.
	ShimSocketRoot = "/run/containerd/s"
)

// Name patterns of Voyager's objects that carry no owner record: those
// the tests name by convention and those the runtime derives from a name.
var (
	bridgeRE = regexp.MustCompile(`^(vy|vdep)[0-9a-z]+$`)
	netnsRE  = regexp.MustCompile(`^(vy|vdep-|isolation-)`)
	testNSRE = regexp.MustCompile(`^voyager-test-(\d+)-\d+$`)
)

type sweeper struct {
	opts Options
	log  *slog.Logger
	rep  Report
	errs []error
}

func (s *sweeper) match(name string) bool { return s.opts.Match == nil || s.opts.Match(name) }

// left reports whether o is provably a leftover: made under a test binary
// that has ended, or (Own) under this process's label by a process that
// has ended.
func (s *sweeper) left(o runtime.Owner) bool {
	if o.EndedTest() {
		return true
	}
	return s.opts.Own && o.Label != "" && o.Label == os.Getenv(runtime.EnvHostOwner) && !o.Alive()
}

func (s *sweeper) removed(kind, name string) {
	s.rep.Removed = append(s.rep.Removed, kind+" "+name)
	s.log.Info("removed", "kind", kind, "name", name)
}

func (s *sweeper) fail(err error) {
	if err != nil {
		s.errs = append(s.errs, err)
	}
}

// Sweep removes leftovers as opts says and reports what it removed. It goes
// on past a failure and returns every failure joined.
func Sweep(ctx context.Context, opts Options) (Report, error) {
	s := &sweeper{opts: opts, log: opts.Logger}
	if s.log == nil {
		s.log = slog.Default()
	}
	owners, err := runtime.Owners()
	s.fail(err)
	// Containers first: their network attachments go with the networks.
	s.containers(ctx, owners)
	for _, o := range owners {
		if !s.match(o.Name) || (!opts.All && !s.left(o)) {
			continue
		}
		if o.Kind == "namespace" {
			// Its containers went above; a record of a namespace that
			// never held one (no runc directory) goes here.
			if !dirExists(filepath.Join(RuncRoot, o.Name)) {
				s.fail(runtime.ForgetOwner(o.Kind, o.Name))
			}
			continue
		}
		s.owned(ctx, o)
	}
	if opts.Match == nil {
		s.staleShimSockets()
	}
	if opts.All {
		s.allNetworks(ctx)
		s.allNetns()
		s.allBridges()
		s.allChains()
		s.allFiles()
	}
	return s.rep, errors.Join(s.errs...)
}

// owned removes the object an owner record names, then the record.
func (s *sweeper) owned(ctx context.Context, o runtime.Owner) {
	switch o.Kind {
	case "network":
		if o.HostNetNS != "" {
			if _, err := os.Stat(o.HostNetNS); err != nil {
				break // the machine's namespace is gone, and its network with it
			}
		}
		if err := runtime.RemoveNetwork(ctx, runtime.NetworkOptions{Name: o.Name, StateDir: o.StateDir, HostNetNS: o.HostNetNS}, s.log); err != nil {
			s.fail(fmt.Errorf("remove network %s: %w", o.Name, err))
			return
		}
		_ = os.RemoveAll(o.StateDir)
		s.removed("network", o.Name)
	case "netns":
		s.delNetns(o.Name)
	case "link":
		s.delLink(o.Name)
	case "cdi", "dir":
		if o.StateDir != "" {
			unmountUnder(o.StateDir)
			s.fail(os.RemoveAll(o.StateDir))
			s.removed(o.Kind, o.StateDir)
		}
	}
	s.fail(runtime.ForgetOwner(o.Kind, o.Name))
}

// containers kills and deletes runc containers of the namespaces swept:
// every voyager* namespace and every namespace an agent recorded with All;
// else voyager-test-<pid>-<n> of ended pids and the namespaces recorded
// under test binaries that ended. Their shims, rootfs mounts and cgroups go
// too.
func (s *sweeper) containers(ctx context.Context, owners []runtime.Owner) {
	recorded := map[string]runtime.Owner{}
	for _, o := range owners {
		if o.Kind == "namespace" {
			recorded[o.Name] = o
		}
	}
	entries, _ := os.ReadDir(RuncRoot)
	for _, e := range entries {
		ns := e.Name()
		o, isRecorded := recorded[ns]
		if !s.match(ns) || (!strings.HasPrefix(ns, "voyager") && !isRecorded) {
			continue
		}
		if !s.opts.All {
			ended := isRecorded && s.left(o)
			if m := testNSRE.FindStringSubmatch(ns); m != nil {
				pid, _ := strconv.Atoi(m[1])
				ended = ended || !processAlive(pid)
			}
			if !ended {
				continue
			}
		}
		s.namespace(ctx, ns)
		if isRecorded {
			s.fail(runtime.ForgetOwner("namespace", ns))
		}
	}
	if s.opts.All {
		s.orphanedRunc(ctx)
	}
}

// orphanedRunc removes, in every namespace's runc directory, the records of
// stopped containers whose bundle is gone (their containerd, a test's
// private one, was removed with its directory), then the runc directories
// left empty. Nothing runs in either.
func (s *sweeper) orphanedRunc(ctx context.Context) {
	entries, _ := os.ReadDir(RuncRoot)
	for _, e := range entries {
		if !s.match(e.Name()) {
			continue
		}
		root := filepath.Join(RuncRoot, e.Name())
		out, _ := exec.CommandContext(ctx, "runc", "--root", root, "list", "--format", "json").Output()
		var conts []struct {
			ID, Status, Bundle string
		}
		_ = json.Unmarshal(out, &conts)
		for _, c := range conts {
			if c.Status != "stopped" || c.Bundle == "" || dirExists(c.Bundle) {
				continue
			}
			if b, err := exec.CommandContext(ctx, "runc", "--root", root, "delete", "--force", c.ID).CombinedOutput(); err != nil {
				s.fail(fmt.Errorf("delete container %s/%s: %w: %s", e.Name(), c.ID, err, bytes.TrimSpace(b)))
				continue
			}
			s.removed("container", e.Name()+"/"+c.ID)
		}
		if os.Remove(root) == nil { // only when empty
			s.removed("runc directory", root)
		}
	}
}

// namespace removes every container of containerd namespace ns.
func (s *sweeper) namespace(ctx context.Context, ns string) {
	root := filepath.Join(RuncRoot, ns)
	out, _ := exec.CommandContext(ctx, "runc", "--root", root, "list", "-q").Output()
	for _, id := range strings.Fields(string(out)) {
		_ = exec.CommandContext(ctx, "runc", "--root", root, "kill", "--all", id, "KILL").Run()
		if b, err := exec.CommandContext(ctx, "runc", "--root", root, "delete", "--force", id).CombinedOutput(); err != nil {
			s.fail(fmt.Errorf("delete container %s/%s: %w: %s", ns, id, err, bytes.TrimSpace(b)))
			continue
		}
		s.removed("container", ns+"/"+id)
	}
	for _, pid := range shimsOf(ns) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	tasks := filepath.Join(TaskRoot, ns)
	unmountUnder(tasks)
	_ = os.RemoveAll(tasks)
	_ = os.Remove(root)
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", ns))
	if d := filepath.Join("/sys/fs/cgroup", ns); dirExists(d) {
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		_ = syscall.Rmdir(d)
	}
}

// shimsOf lists the containerd shims serving namespace ns.
func shimsOf(ns string) []int {
	var pids []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) == 0 || !strings.Contains(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		if i := slices.Index(args, "-namespace"); i >= 0 && i+1 < len(args) && args[i+1] == ns {
			pids = append(pids, pid)
		}
	}
	return pids
}

// allNetworks removes every isolated network whose state directory is in
// NetStateRoot (the runtime's default), recorded or not.
func (s *sweeper) allNetworks(ctx context.Context) {
	entries, _ := os.ReadDir(NetStateRoot)
	for _, e := range entries {
		name := e.Name()
		if !s.match(name) {
			continue
		}
		dir := filepath.Join(NetStateRoot, name)
		if err := runtime.RemoveNetwork(ctx, runtime.NetworkOptions{Name: name, StateDir: dir}, s.log); err != nil {
			s.fail(fmt.Errorf("remove network %s: %w", name, err))
			continue
		}
		unmountUnder(dir)
		s.fail(os.RemoveAll(dir))
		s.removed("network", name)
	}
}

// allNetns removes the named network namespaces the tests make.
func (s *sweeper) allNetns() {
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && netnsRE.MatchString(f[0]) && s.match(f[0]) {
			s.delNetns(f[0])
		}
	}
}

// allBridges removes the runtime's bridges (vy + a hash of the network's
// name) and the tests' machine bridges.
func (s *sweeper) allBridges() {
	out, _ := exec.Command("ip", "-o", "link", "show", "type", "bridge").Output()
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name := strings.TrimSuffix(strings.SplitN(f[1], "@", 2)[0], ":")
		if bridgeRE.MatchString(name) && s.match(name) {
			s.delLink(name)
		}
	}
}

// allChains removes the runtime's chains (VY<hash>-*) and the CNI chains
// of Voyager's networks, with every rule that jumps to them, and the
// MASQUERADE rules the runtime adds (comment voyager-<name>).
func (s *sweeper) allChains() {
	ipt, err := iptables.New()
	if err != nil {
		s.fail(fmt.Errorf("sweep chains: %w", err))
		return
	}
	for _, table := range []string{"filter", "nat"} {
		chains, err := ipt.ListChains(table)
		if err != nil {
			s.fail(err)
			continue
		}
		var ours []string
		for _, c := range chains {
			if strings.HasPrefix(c, "VY") && s.match(c) {
				ours = append(ours, c)
				continue
			}
			if strings.HasPrefix(c, "CNI-") && c != "CNI-FORWARD" && c != "CNI-HOSTPORT-DNAT" && c != "CNI-HOSTPORT-SETMARK" && c != "CNI-HOSTPORT-MASQ" && c != "CNI-ADMIN" {
				rules, _ := ipt.List(table, c)
				if slices.ContainsFunc(rules, func(r string) bool { return strings.Contains(r, `"voyager-`) || strings.Contains(r, "name: voyager-") }) && s.match(c) {
					ours = append(ours, c)
				}
			}
		}
		if len(ours) == 0 && table == "filter" {
			continue
		}
		// Rules anywhere that jump to a chain being removed, or that the
		// runtime marked as its own.
		for _, c := range chains {
			rules, err := ipt.List(table, c)
			if err != nil {
				continue
			}
			for _, r := range rules {
				spec := strings.Fields(r)
				if len(spec) < 3 || spec[0] != "-A" {
					continue
				}
				jump := ""
				if i := slices.Index(spec, "-j"); i >= 0 && i+1 < len(spec) {
					jump = spec[i+1]
				}
				mine := slices.Contains(ours, jump) && !slices.Contains(ours, c)
				if !mine && table == "nat" && c == "POSTROUTING" && strings.Contains(r, "voyager-") && s.opts.Match == nil {
					mine = true
				}
				if mine {
					if err := ipt.Delete(table, c, unquote(spec[2:])...); err != nil {
						s.fail(fmt.Errorf("delete rule %q: %w", r, err))
					}
				}
			}
		}
		for _, c := range ours {
			s.fail(ipt.ClearChain(table, c))
		}
		for _, c := range ours {
			if err := ipt.DeleteChain(table, c); err != nil {
				s.fail(fmt.Errorf("delete chain %s %s: %w", table, c, err))
				continue
			}
			s.removed("chain", table+"/"+c)
		}
	}
}

// unquote splits iptables -S output's quoted comments back into single
// arguments.
func unquote(spec []string) []string {
	var out []string
	for i := 0; i < len(spec); i++ {
		a := spec[i]
		if strings.HasPrefix(a, `"`) && !(len(a) > 1 && strings.HasSuffix(a, `"`)) {
			j := i
			for j+1 < len(spec) && !strings.HasSuffix(spec[j], `"`) {
				j++
			}
			a = strings.Join(spec[i:j+1], " ")
			i = j
		}
		out = append(out, strings.Trim(a, `"`))
	}
	return out
}

// allFiles removes CNI address records, simulated CDI specs and the
// directories of private test containerds no process uses.
func (s *sweeper) allFiles() {
	var paths []string
	for _, g := range []string{"/var/lib/cni/networks/voyager-*", "/var/lib/cni/results/voyager-*", CDIRoot + "/*",
		filepath.Join(os.TempDir(), "voyager-cdi-*")} {
		m, _ := filepath.Glob(g)
		paths = append(paths, m...)
	}
	daemons, _ := filepath.Glob(filepath.Join(os.TempDir(), "vctrd*"))
	for _, d := range daemons {
		if !inUse(d) {
			paths = append(paths, d)
		}
	}
	for _, p := range paths {
		if !s.match(filepath.Base(p)) {
			continue
		}
		unmountUnder(p)
		if err := os.RemoveAll(p); err != nil {
			s.fail(err)
			continue
		}
		s.removed("file", p)
	}
}

func (s *sweeper) delNetns(name string) {
	if b, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil && !bytes.Contains(b, []byte("No such file")) {
		s.fail(fmt.Errorf("delete netns %s: %w: %s", name, err, bytes.TrimSpace(b)))
		return
	}
	s.removed("netns", name)
}

func (s *sweeper) delLink(name string) {
	if b, err := exec.Command("ip", "link", "delete", name).CombinedOutput(); err != nil && !bytes.Contains(b, []byte("Cannot find device")) {
		s.fail(fmt.Errorf("delete link %s: %w: %s", name, err, bytes.TrimSpace(b)))
		return
	}
	s.removed("link", name)
}

// inUse reports whether a live process names dir in its command line.
func inUse(dir string) bool {
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		if b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline")); err == nil && bytes.Contains(b, []byte(dir)) {
			return true
		}
	}
	return false
}

// unmountUnder lazily unmounts every mount at or below dir, deepest first.
func unmountUnder(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var mounts []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			mounts = append(mounts, f[4])
		}
	}
	slices.SortFunc(mounts, func(a, b string) int { return len(b) - len(a) })
	for _, m := range mounts {
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
}

func processAlive(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return err == nil
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// staleShimSockets removes the shim sockets in ShimSocketRoot that
// nothing listens on any more and that are over a minute old: a shim
// killed before it could remove its own leaves one (three a make test
// run, found accumulating on a test machine). A live shim accepts a
// connection, so a socket that refuses one is no process's; the minute
// spares one whose shim has bound it and not yet begun to listen.
func (s *sweeper) staleShimSockets() {
	entries, _ := os.ReadDir(ShimSocketRoot)
	for _, e := range entries {
		if e.Type()&os.ModeSocket == 0 {
			continue
		}
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < time.Minute {
			continue
		}
		p := filepath.Join(ShimSocketRoot, e.Name())
		c, err := net.DialTimeout("unix", p, time.Second)
		if err == nil {
			_ = c.Close()
			continue
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			continue
		}
		if err := os.Remove(p); err != nil {
			s.fail(fmt.Errorf("remove stale shim socket %s: %w", p, err))
			continue
		}
		s.removed("shim socket", p)
	}
}
