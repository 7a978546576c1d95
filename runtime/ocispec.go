package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"

	containerd "github.com/containerd/containerd"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/contrib/seccomp"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// specOpts builds the OCI spec: containerd's defaults (capabilities,
// masked paths, no new privileges) plus the default seccomp profile, the
// network (the namespace at nsPath, else the host's), the user, the
// limits, the mounts and the devices.
func (c *Containerd) specOpts(img containerd.Image, spec Spec, uid, gid uint32, nsPath string) []oci.SpecOpts {
	env := make([]string, 0, len(spec.Env))
	for k, v := range spec.Env {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	opts := []oci.SpecOpts{
		oci.WithDefaultSpec(),
		oci.WithDefaultUnixDevices,
		oci.WithImageConfig(img),
		oci.WithEnv(env),
		oci.WithUIDGID(uid, gid),
		withNetwork(nsPath),
		oci.WithHostHostsFile,
		oci.WithHostResolvconf,
		oci.WithNoNewPrivileges,
		seccomp.WithDefaultProfile(),
		// The container's own cgroup, read-only, so that what runs inside can
		// read its limits (containerd's default spec, unlike CRI's, has none).
		oci.WithMounts([]specs.Mount{{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup",
			Options: []string{"ro", "nosuid", "noexec", "nodev"}}}),
	}
	if len(spec.Args) > 0 {
		opts = append(opts, oci.WithProcessArgs(spec.Args...))
	}
	if spec.WorkDir != "" {
		opts = append(opts, oci.WithProcessCwd(spec.WorkDir))
	}
	if spec.MemoryBytes > 0 {
		opts = append(opts, oci.WithMemoryLimit(uint64(spec.MemoryBytes)))
	}
	if spec.CPUMilli > 0 {
		const period = 100000 // µs
		opts = append(opts, oci.WithCPUCFS(spec.CPUMilli*period/1000, period))
	}
	if spec.PidsLimit > 0 {
		opts = append(opts, oci.WithPidsLimit(spec.PidsLimit))
	}
	if spec.ShmBytes > 0 {
		opts = append(opts, oci.WithDevShmSize(spec.ShmBytes/1024))
	}
	if len(spec.Rlimits) > 0 {
		rs, lowered := Grantable(spec.Rlimits)
		if lowered {
			level := slog.LevelDebug
			if c.loweredOnce.CompareAndSwap(false, true) {
				level = slog.LevelWarn
			}
			c.log.Log(context.Background(), level, "container limits lowered to this host's: without CAP_SYS_RESOURCE no hard limit can be raised", "id", spec.ID, "asked", fmtRlimits(spec.Rlimits), "granted", fmtRlimits(rs))
		}
		opts = append(opts, withRlimits(rs))
	}
	if len(spec.Mounts) > 0 {
		ms := make([]specs.Mount, 0, len(spec.Mounts))
		for _, m := range spec.Mounts {
			mode := "rw"
			if m.ReadOnly {
				mode = "ro"
			}
			ms = append(ms, specs.Mount{Destination: m.Target, Type: "bind", Source: m.Source, Options: []string{"rbind", mode}})
		}
		opts = append(opts, oci.WithMounts(ms))
	}
	if len(spec.CDIDevices) > 0 {
		opts = append(opts, withCDIDevices(c.opts.CDISpecDirs, spec.CDIDevices))
	}
	return opts
}

// withNetwork joins the network namespace at nsPath, with IPv6 off in it
// (the CNI network is IPv4; a link-local IPv6 path to the host is one the
// firewall would not see), or the host's namespace when nsPath is empty.
func withNetwork(nsPath string) oci.SpecOpts {
	if nsPath == "" {
		return oci.WithHostNamespace(specs.NetworkNamespace)
	}
	return func(ctx context.Context, cl oci.Client, cont *containers.Container, s *oci.Spec) error {
		if err := oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: nsPath})(ctx, cl, cont, s); err != nil {
			return err
		}
		if s.Linux.Sysctl == nil {
			s.Linux.Sysctl = map[string]string{}
		}
		s.Linux.Sysctl["net.ipv6.conf.all.disable_ipv6"] = "1"
		s.Linux.Sysctl["net.ipv6.conf.default.disable_ipv6"] = "1"
		return nil
	}
}

// withRlimits sets each of rs on the process, in place of the default
// spec's limit of the same type.
func withRlimits(rs []Rlimit) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process == nil {
			s.Process = &specs.Process{}
		}
		for _, r := range rs {
			s.Process.Rlimits = slices.DeleteFunc(s.Process.Rlimits, func(p specs.POSIXRlimit) bool { return p.Type == r.Type })
			s.Process.Rlimits = append(s.Process.Rlimits, specs.POSIXRlimit{Type: r.Type, Soft: r.Soft, Hard: r.Hard})
		}
		return nil
	}
}

// fmtRlimits writes rs for a log: "RLIMIT_NOFILE=1024:1024 …".
func fmtRlimits(rs []Rlimit) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%s=%d:%d", r.Type, r.Soft, r.Hard)
	}
	return strings.Join(parts, " ")
}

// withCDIDevices injects CDI devices with a cache read fresh for this
// container, so a spec written since the last start is seen.
func withCDIDevices(dirs, devices []string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		cache, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
		if cache == nil {
			return fmt.Errorf("read CDI specs in %v: %w", dirs, err)
		}
		if unresolved, err := cache.InjectDevices(s, devices...); err != nil {
			return fmt.Errorf("inject CDI devices %v (unresolved %v, spec dirs %v): %w", devices, unresolved, dirs, err)
		}
		return nil
	}
}

// MissingCDIDevices reads the CDI specs in dirs as a container start
// would and returns those of the fully qualified device names
// ("nvidia.com/gpu=GPU-…") that no spec defines. specErrs joins the
// errors of spec files that could not be read or parsed (nil when there
// were none): a device such a file meant to define is missing for that
// reason.
func MissingCDIDevices(dirs, devices []string) (missing []string, specErrs error) {
	cache, _ := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	for _, d := range devices {
		if cache.GetDevice(d) == nil {
			missing = append(missing, d)
		}
	}
	var errs []error
	for path, es := range cache.GetErrors() {
		for _, e := range es {
			errs = append(errs, fmt.Errorf("read CDI spec %s: %w", path, e))
		}
	}
	sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
	return missing, errors.Join(errs...)
}

// prepareHost creates the log directory and the mount sources the spec asks for.
func prepareHost(spec Spec, uid, gid uint32) error {
	if spec.LogPath != "" {
		if err := os.MkdirAll(filepath.Dir(spec.LogPath), 0o750); err != nil {
			return fmt.Errorf("create log directory: %w", err)
		}
	}
	for _, m := range spec.Mounts {
		if !m.Create {
			// runc's own error for a missing source names neither the
			// mount nor the fix.
			if _, err := os.Stat(m.Source); err != nil {
				return fmt.Errorf("mount %s at %s: the source must exist on this node: %w", m.Source, m.Target, err)
			}
			continue
		}
		if fi, err := os.Stat(m.Source); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && m.Private && (st.Uid != uid || !fi.IsDir()) {
				return fmt.Errorf("mount %s at %s: it exists but is not a directory of uid %d (owner %d); a private mount is never handed over", m.Source, m.Target, uid, st.Uid)
			}
			if err := ownDir(m.Source, fi, uid, gid); err != nil {
				return err
			}
			continue
		}
		if err := os.MkdirAll(m.Source, 0o700); err != nil {
			return fmt.Errorf("create mount source %s: %w", m.Source, err)
		}
		if err := os.Chown(m.Source, int(uid), int(gid)); err != nil {
			return fmt.Errorf("chown mount source %s: %w", m.Source, err)
		}
	}
	return nil
}

// ownDir gives an existing created mount source (a home) to uid, mode
// 0700: a home made before its owner had a user id of their own is handed
// over, all of it, once.
func ownDir(dir string, fi os.FileInfo, uid, gid uint32) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if st.Uid != uid {
		err := filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if err := os.Lchown(p, int(uid), int(gid)); err != nil {
				return err
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("hand mount source %s to uid %d: %w", dir, uid, err)
		}
	}
	if fi.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("chmod mount source %s: %w", dir, err)
		}
	}
	return nil
}
