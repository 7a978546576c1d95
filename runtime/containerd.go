package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	cgroupsv1 "github.com/containerd/cgroups/stats/v1"
	cgroupsv2 "github.com/containerd/cgroups/v2/stats"
	containerd "github.com/containerd/containerd"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/errdefs"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/distribution/reference"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// Defaults of ContainerdOptions.
const (
	DefaultAddress     = "/run/containerd/containerd.sock"
	DefaultNamespace   = "voyager"
	DefaultSnapshotter = "overlayfs"
)

// labelLogPath records a container's log file, so that Status can report
// it after the agent that started the container has restarted.
const labelLogPath = "voyager.runtime/log"

// labelStarted marks a container whose process was started once. A
// container without a task is then told apart: with the mark its process
// ran and is gone (exit code unknown: the task was deleted, or the machine
// restarted); without it the process never started (the caller died
// between creating the container and starting its task), so it is
// StateCreated and its caller starts it afresh instead of reporting an exit.
const labelStarted = "voyager.runtime/started"

// ContainerdOptions configure a Containerd. The zero value is usable.
type ContainerdOptions struct {
	// Address is containerd's socket. Default DefaultAddress.
	Address string
	// Namespace isolates Voyager's containers. Default DefaultNamespace.
	Namespace string
	// Snapshotter unpacks images. Default DefaultSnapshotter.
	Snapshotter string
	// CDISpecDirs are where CDI specs are read from for Spec.CDIDevices.
	// Default cdi.DefaultSpecDirs (/etc/cdi, /var/run/cdi).
	CDISpecDirs []string
	// RuntimeBinary replaces runc as the OCI runtime, for example
	// "nvidia-container-runtime" when GPUs are given by
	// NVIDIA_VISIBLE_DEVICES. Empty: runc.
	RuntimeBinary string
	// Network is the containers' network: the host's (the zero value) or
	// one namespace each on this instance's CNI bridge.
	Network NetworkOptions
	// Logger receives the runtime's logs. Default slog.Default().
	Logger *slog.Logger
}

// Containerd is a Runtime over containerd's Go client.
type Containerd struct {
	client *containerd.Client
	opts   ContainerdOptions
	log    *slog.Logger
	net    *cniNetwork // nil: the host's network

	// starting serialises Starts of one id: containerd creates the
	// snapshot before the container, so two concurrent creates of one id
	// would otherwise see each other's half-made container.
	mu       sync.Mutex
	starting map[string]*idLock

	// loweredOnce makes the first lowered limit a warning, later ones debug.
	loweredOnce atomic.Bool
}

var (
	_ Runtime       = (*Containerd)(nil)
	_ ProcessLister = (*Containerd)(nil)
)

// NewContainerd connects to containerd and checks that it answers.
func NewContainerd(ctx context.Context, opts ContainerdOptions) (*Containerd, error) {
	if opts.Address == "" {
		opts.Address = DefaultAddress
	}
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	if opts.Snapshotter == "" {
		opts.Snapshotter = DefaultSnapshotter
	}
	if len(opts.CDISpecDirs) == 0 {
		opts.CDISpecDirs = cdi.DefaultSpecDirs
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if _, err := os.Stat(opts.Address); err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", opts.Address, err)
	}
	cli, err := containerd.New(opts.Address,
		containerd.WithDefaultNamespace(opts.Namespace),
		containerd.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", opts.Address, err)
	}
	if _, err := cli.Version(ctx); err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("connect to containerd at %s: %w", opts.Address, err)
	}
	c := &Containerd{
		client:   cli,
		opts:     opts,
		log:      opts.Logger.With("runtime", "containerd", "namespace", opts.Namespace),
		starting: map[string]*idLock{},
	}
	switch opts.Network.Mode {
	case "", NetworkHost:
	case NetworkIsolated:
		if c.net, err = newCNINetwork(opts.Network, c.log); err != nil {
			_ = cli.Close()
			return nil, fmt.Errorf("%w: %w", ErrNetworkSetup, err)
		}
		if err := c.collectNetwork(ctx); err != nil {
			c.log.Warn("could not clean up the network of containers that are gone", "err", err)
		}
	default:
		_ = cli.Close()
		return nil, fmt.Errorf("connect to containerd: network mode %q: want %s or %s", opts.Network.Mode, NetworkIsolated, NetworkHost)
	}
	return c, nil
}

// Isolated reports whether containers get their own network namespace.
func (c *Containerd) Isolated() bool { return c.net != nil }

// Subnet is the IPv4 subnet (CIDR) of the containers' own addresses, ""
// on the host's network.
func (c *Containerd) Subnet() string {
	if c.net == nil {
		return ""
	}
	return c.net.opts.Subnet
}

// RemoveNetwork deletes the isolated network's bridge, firewall chains and
// address records, for a machine that stops running sessions (and for
// tests). Remove every container first. With the host's network it does
// nothing.
func (c *Containerd) RemoveNetwork() error {
	if c.net == nil {
		return nil
	}
	return c.net.remove(context.Background())
}

// collectNetwork tears down the network attachments of containers that
// are gone from the namespace: a container removed behind the runtime's
// back would otherwise keep its address and its published ports' NAT
// rules, which would catch the next session given those ports.
func (c *Containerd) collectNetwork(ctx context.Context) error {
	conts, err := c.client.Containers(ctx)
	if err != nil {
		return fmt.Errorf("list containers: %w", err)
	}
	ids, nss := map[string]bool{}, map[string]bool{}
	for _, cont := range conts {
		ids[cont.ID()] = true
		if labels, err := cont.Labels(ctx); err == nil && labels[labelNetNS] != "" {
			nss[labels[labelNetNS]] = true
		}
	}
	return c.net.gc(ctx, ids, nss)
}

// Close closes the connection. Containers keep running.
func (c *Containerd) Close() error { return c.client.Close() }

// Import reads an image archive (docker-archive or OCI layout tar), stores
// and unpacks its images, and returns their names.
func (c *Containerd) Import(ctx context.Context, r io.Reader) ([]string, error) {
	imgs, err := c.client.Import(ctx, r)
	if err != nil {
		return nil, fmt.Errorf("import image archive: %w", err)
	}
	var names []string
	for _, i := range imgs {
		img := containerd.NewImage(c.client, i)
		if err := img.Unpack(ctx, c.opts.Snapshotter); err != nil {
			return nil, fmt.Errorf("unpack image %s: %w", i.Name, err)
		}
		names = append(names, i.Name)
	}
	return names, nil
}

// EnsureImage makes ref present and unpacked, pulling it if absent. An
// image under LocalRegistry is never pulled: absent, it is an error that
// says to import it.
func (c *Containerd) EnsureImage(ctx context.Context, ref string) error {
	ref = normalizeRef(ref)
	img, err := c.client.GetImage(ctx, ref)
	if errdefs.IsNotFound(err) {
		if IsLocalImage(ref) {
			return notImported(ref, c.opts.Namespace)
		}
		c.log.Info("pulling image", "image", ref)
		if _, err := c.client.Pull(ctx, ref, containerd.WithPullUnpack, containerd.WithPullSnapshotter(c.opts.Snapshotter)); err != nil {
			return pullError(ref, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("get image %s: %w", ref, err)
	}
	ok, err := img.IsUnpacked(ctx, c.opts.Snapshotter)
	if err != nil {
		return fmt.Errorf("check image %s: %w", ref, err)
	}
	if !ok {
		if err := img.Unpack(ctx, c.opts.Snapshotter); err != nil {
			return fmt.Errorf("unpack image %s: %w", ref, err)
		}
	}
	return nil
}

// Start creates the container and starts its process.
func (c *Containerd) Start(ctx context.Context, spec Spec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	img, err := c.client.GetImage(ctx, normalizeRef(spec.Image))
	if errdefs.IsNotFound(err) {
		return fmt.Errorf("start container %s: %s: %w", spec.ID, spec.Image, ErrImageNotFound)
	}
	if err != nil {
		return fmt.Errorf("start container %s: %w", spec.ID, err)
	}
	unlock := c.lockID(spec.ID)
	defer unlock()
	uid, gid := spec.User()
	if err := prepareHost(spec, uid, gid); err != nil {
		return fmt.Errorf("start container %s: %w", spec.ID, err)
	}
	labels := cloneLabels(spec.Labels)
	if spec.LogPath != "" {
		labels[labelLogPath] = spec.LogPath
	}
	if spec.DenyEgress && c.net == nil {
		return fmt.Errorf("start container %s: %w: denying egress needs a network of the container's own (VOYAGER_AGENT_NETWORK=isolated), not the host's", spec.ID, ErrInvalidSpec)
	}
	nsPath := ""
	if c.net != nil {
		// The namespace is made before the container, which records it,
		// and attached after, so that a Start that dies half-way leaves a
		// container whose Remove finds all of it.
		if nsPath, err = c.net.newNetNS(); err != nil {
			return fmt.Errorf("start container %s: %w", spec.ID, err)
		}
		labels[labelNetNS] = nsPath
		labels[labelPublish] = encodePublish(spec.Publish)
	}
	copts := []containerd.NewContainerOpts{
		containerd.WithImage(img),
		containerd.WithSnapshotter(c.opts.Snapshotter),
		containerd.WithNewSnapshot(spec.ID, img),
		containerd.WithContainerLabels(labels),
	}
	if c.opts.RuntimeBinary != "" {
		copts = append(copts, containerd.WithRuntime("io.containerd.runc.v2", &options.Options{BinaryName: c.opts.RuntimeBinary}))
	}
	copts = append(copts, containerd.WithNewSpec(c.specOpts(img, spec, uid, gid, nsPath)...))

	cont, err := c.client.NewContainer(ctx, spec.ID, copts...)
	if errdefs.IsAlreadyExists(err) {
		if _, lerr := c.client.LoadContainer(ctx, spec.ID); lerr == nil {
			return fmt.Errorf("start container %s: %w", spec.ID, ErrExists)
		}
		// A snapshot left by a create that died half-way: clear it, retry once.
		_ = c.client.SnapshotService(c.opts.Snapshotter).Remove(ctx, spec.ID)
		cont, err = c.client.NewContainer(ctx, spec.ID, copts...)
	}
	if err != nil {
		if nsPath != "" {
			_ = c.net.teardown(context.WithoutCancel(ctx), spec.ID, nsPath, nil)
		}
		if errdefs.IsAlreadyExists(err) {
			return fmt.Errorf("start container %s: %w", spec.ID, ErrExists)
		}
		return fmt.Errorf("create container %s: %w", spec.ID, err)
	}
	started := map[string]string{}
	if c.net != nil {
		ip, err := c.net.setup(ctx, spec.ID, nsPath, spec)
		var mesh []MeshPeer
		if err == nil && spec.Mesh != nil {
			mesh, err = spec.Mesh(ctx, ip)
		}
		if err == nil {
			err = c.net.rules(ctx, spec.ID, ip, spec, mesh)
		}
		if err != nil {
			_ = c.removeContainer(context.WithoutCancel(ctx), cont)
			return fmt.Errorf("start container %s: %w", spec.ID, err)
		}
		started[labelIP] = ip
	}
	creator := cio.NullIO
	if spec.LogPath != "" {
		creator = cio.LogFile(spec.LogPath)
	}
	task, err := cont.NewTask(ctx, creator)
	if err == nil {
		err = task.Start(ctx)
		if err != nil {
			_, _ = task.Delete(context.WithoutCancel(ctx), containerd.WithProcessKill)
		}
	}
	if err != nil {
		_ = c.removeContainer(context.WithoutCancel(ctx), cont)
		return fmt.Errorf("start container %s: %w", spec.ID, err)
	}
	// Until this label is written, a running task says it started; once the
	// task is gone, only the label does.
	started[labelStarted] = time.Now().UTC().Format(time.RFC3339Nano)
	if _, err := cont.SetLabels(context.WithoutCancel(ctx), started); err != nil {
		c.log.Warn("mark container started", "id", spec.ID, "err", err)
	}
	c.log.Debug("container started", "id", spec.ID, "pid", task.Pid())
	return nil
}

// idLock is one id's start lock and how many Starts hold or wait on it.
type idLock struct {
	sync.Mutex
	users int
}

// lockID holds id's start lock until the returned func is called.
func (c *Containerd) lockID(id string) func() {
	c.mu.Lock()
	l, ok := c.starting[id]
	if !ok {
		l = &idLock{}
		c.starting[id] = l
	}
	l.users++
	c.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		c.mu.Lock()
		if l.users--; l.users == 0 {
			delete(c.starting, id)
		}
		c.mu.Unlock()
	}
}

// Status reports one container.
func (c *Containerd) Status(ctx context.Context, id string) (Info, error) {
	cont, err := c.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return Info{}, fmt.Errorf("status of container %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Info{}, fmt.Errorf("status of container %s: %w", id, err)
	}
	return c.info(ctx, cont)
}

func (c *Containerd) info(ctx context.Context, cont containerd.Container) (Info, error) {
	ci, err := cont.Info(ctx, containerd.WithoutRefreshedMetadata)
	if errdefs.IsNotFound(err) {
		return Info{}, fmt.Errorf("status of container %s: %w", cont.ID(), ErrNotFound)
	}
	if err != nil {
		return Info{}, fmt.Errorf("status of container %s: %w", cont.ID(), err)
	}
	in := Info{ID: ci.ID, Image: ci.Image, Labels: cloneLabels(ci.Labels), LogPath: ci.Labels[labelLogPath], State: StateStopped, ExitCode: -1, Started: ci.CreatedAt,
		IP: ci.Labels[labelIP]}
	for _, l := range []string{labelLogPath, labelStarted, labelNetNS, labelPublish, labelIP} {
		delete(in.Labels, l)
	}
	task, err := cont.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		if _, started := ci.Labels[labelStarted]; !started {
			in.State = StateCreated // created, never started: nothing ran
			return in, nil
		}
		return in, nil // it ran, ended and its task was deleted, or the machine restarted
	}
	if err != nil {
		return Info{}, fmt.Errorf("status of container %s: %w", cont.ID(), err)
	}
	st, err := task.Status(ctx)
	if errdefs.IsNotFound(err) {
		return in, nil
	}
	if err != nil {
		return Info{}, fmt.Errorf("status of container %s: %w", cont.ID(), err)
	}
	switch st.Status {
	case containerd.Running, containerd.Paused, containerd.Pausing:
		in.State, in.Pid = StateRunning, task.Pid()
	case containerd.Created:
		in.State = StateCreated
	default:
		in.ExitCode = int(st.ExitStatus)
	}
	return in, nil
}

// Wait blocks until the container's process exits.
func (c *Containerd) Wait(ctx context.Context, id string) (code int, err error) {
	defer func() {
		// A deadline that ends an RPC comes back as a gRPC error, and the
		// server may notice the (propagated) deadline a hair before our
		// own timer fires: wait out that hair, then report the context's
		// own error, as the contract says.
		if err != nil && ctx.Err() == nil && isDeadline(err) {
			if dl, ok := ctx.Deadline(); ok && time.Until(dl) < time.Second {
				<-ctx.Done()
			}
		}
		if err != nil && ctx.Err() != nil {
			code, err = -1, fmt.Errorf("wait for container %s: %w", id, ctx.Err())
		}
	}()
	cont, err := c.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return -1, fmt.Errorf("wait for container %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return -1, fmt.Errorf("wait for container %s: %w", id, err)
	}
	task, err := cont.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return -1, nil // no process left to wait for; exit code unknown
	}
	if err != nil {
		return -1, fmt.Errorf("wait for container %s: %w", id, err)
	}
	ch, err := task.Wait(ctx)
	if err != nil {
		return -1, fmt.Errorf("wait for container %s: %w", id, err)
	}
	select {
	case s := <-ch:
		if s.Error() != nil {
			return -1, fmt.Errorf("wait for container %s: %w", id, s.Error())
		}
		return int(s.ExitCode()), nil
	case <-ctx.Done():
		return -1, fmt.Errorf("wait for container %s: %w", id, ctx.Err())
	}
}

// Stop sends SIGTERM, waits up to grace, then sends SIGKILL to every
// process of the container.
func (c *Containerd) Stop(ctx context.Context, id string, grace time.Duration) error {
	cont, err := c.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return fmt.Errorf("stop container %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("stop container %s: %w", id, err)
	}
	task, err := cont.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stop container %s: %w", id, err)
	}
	ch, err := task.Wait(ctx)
	if err != nil {
		return fmt.Errorf("stop container %s: %w", id, err)
	}
	if st, err := task.Status(ctx); err == nil && st.Status == containerd.Stopped {
		return nil
	}
	if err := task.Kill(ctx, syscall.SIGTERM); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("stop container %s: send SIGTERM: %w", id, err)
	}
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop container %s: %w", id, ctx.Err())
	case <-timer.C:
	}
	c.log.Info("container ignored SIGTERM; killing", "id", id, "grace", grace)
	if err := task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("stop container %s: send SIGKILL: %w", id, err)
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop container %s: %w", id, ctx.Err())
	}
}

// Remove deletes the container, killing its process if it still runs.
func (c *Containerd) Remove(ctx context.Context, id string) error {
	cont, err := c.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove container %s: %w", id, err)
	}
	return c.removeContainer(ctx, cont)
}

// removeContainer kills the container's task, tears its network down and
// deletes it.
func (c *Containerd) removeContainer(ctx context.Context, cont containerd.Container) error {
	id := cont.ID()
	task, err := cont.Task(ctx, nil)
	switch {
	case err == nil:
		if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("remove container %s: delete task: %w", id, err)
		}
	case !errdefs.IsNotFound(err):
		return fmt.Errorf("remove container %s: %w", id, err)
	}
	if c.net != nil {
		labels, err := cont.Labels(ctx)
		if err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("remove container %s: %w", id, err)
		}
		if ns := labels[labelNetNS]; ns != "" {
			if err := c.net.teardown(ctx, id, ns, decodePublish(labels[labelPublish])); err != nil {
				return fmt.Errorf("remove container %s: %w", id, err)
			}
		}
	}
	if err := cont.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("remove container %s: %w", id, err)
	}
	return nil
}

// List returns the containers whose labels include labels.
func (c *Containerd) List(ctx context.Context, labels map[string]string) ([]Info, error) {
	conts, err := c.client.Containers(ctx)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	var out []Info
	for _, cont := range conts {
		in, err := c.info(ctx, cont)
		if errors.Is(err, ErrNotFound) {
			continue // removed while we listed
		}
		if err != nil {
			return nil, fmt.Errorf("list containers: %w", err)
		}
		if matches(in.Labels, labels) {
			out = append(out, in)
		}
	}
	slices.SortFunc(out, func(a, b Info) int { return cmpString(a.ID, b.ID) })
	return out, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Namespace returns the containerd namespace the runtime works in.
func (c *Containerd) Namespace() string { return c.opts.Namespace }

// Address returns containerd's socket.
func (c *Containerd) Address() string { return c.opts.Address }

// isDeadline reports whether err is a deadline that ended an RPC, however
// containerd's client wrapped it.
func isDeadline(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errdefs.IsDeadlineExceeded(err) ||
		strings.Contains(err.Error(), context.DeadlineExceeded.Error())
}

// normalizeRef writes an image reference the way containerd stores it:
// "voyager/jupyter:latest" is "docker.io/voyager/jupyter:latest" once
// imported or pulled. A reference that does not parse is left as it is,
// for containerd to refuse with its own words.
func normalizeRef(ref string) string {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return ref
	}
	return named.String()
}

// CPUUsage reads the container's cumulative CPU time from its task's
// cgroup metrics (cgroup v1's cpuacct usage or v2's cpu.stat usage_usec).
func (c *Containerd) CPUUsage(ctx context.Context, id string) (time.Duration, error) {
	cont, err := c.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return 0, fmt.Errorf("CPU usage of container %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("CPU usage of container %s: %w", id, err)
	}
	task, err := cont.Task(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("CPU usage of container %s: no process: %w", id, err)
	}
	m, err := task.Metrics(ctx)
	if err != nil {
		return 0, fmt.Errorf("CPU usage of container %s: %w", id, err)
	}
	if m.Data == nil {
		return 0, fmt.Errorf("CPU usage of container %s: the runtime returned no metrics", id)
	}
	return cpuFromMetrics(m.Data.GetTypeUrl(), m.Data.GetValue())
}

// Pids lists the host pids of the container's processes, as its shim
// reads them from the container's cgroup: every process the session
// started, however it forked.
func (c *Containerd) Pids(ctx context.Context, id string) ([]uint32, error) {
	cont, err := c.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("list processes of container %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("list processes of container %s: %w", id, err)
	}
	task, err := cont.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil, nil // created, or its process ended: no process
	}
	if err != nil {
		return nil, fmt.Errorf("list processes of container %s: %w", id, err)
	}
	ps, err := task.Pids(ctx)
	if errdefs.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list processes of container %s: %w", id, err)
	}
	out := make([]uint32, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.Pid)
	}
	slices.Sort(out)
	return out, nil
}

// cpuFromMetrics decodes the CPU time out of a shim's cgroup metrics by
// their type: the shim of containerd 1.6 and 1.7 sends cgroups v1 or v2
// Metrics, the same protobuf messages under both.
func cpuFromMetrics(typeURL string, b []byte) (time.Duration, error) {
	switch strings.TrimPrefix(typeURL, "/") {
	case "io.containerd.cgroups.v1.Metrics":
		var m cgroupsv1.Metrics
		if err := m.Unmarshal(b); err != nil {
			return 0, fmt.Errorf("decode cgroup v1 metrics: %w", err)
		}
		if m.CPU == nil || m.CPU.Usage == nil {
			return 0, errors.New("decode cgroup v1 metrics: no CPU usage")
		}
		return time.Duration(m.CPU.Usage.Total), nil
	case "io.containerd.cgroups.v2.Metrics":
		var m cgroupsv2.Metrics
		if err := m.Unmarshal(b); err != nil {
			return 0, fmt.Errorf("decode cgroup v2 metrics: %w", err)
		}
		if m.CPU == nil {
			return 0, errors.New("decode cgroup v2 metrics: no CPU usage")
		}
		return time.Duration(m.CPU.UsageUsec) * time.Microsecond, nil
	}
	return 0, fmt.Errorf("decode container metrics: unknown type %q", typeURL)
}

// DialLoopback opens a TCP connection to port on the loopback of
// container id: from inside the container's own network namespace when it
// has one, so that what listens there (a Ray dashboard) needs no address
// any other session could reach; on the host's network, the host's
// loopback. The connection works from any thread once made.
func (c *Containerd) DialLoopback(ctx context.Context, id string, port int) (net.Conn, error) {
	cont, err := c.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("dial container %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("dial container %s: %w", id, err)
	}
	labels, err := cont.Labels(ctx)
	if err != nil {
		return nil, fmt.Errorf("dial container %s: %w", id, err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	var d net.Dialer
	nsPath := labels[labelNetNS]
	if nsPath == "" {
		return d.DialContext(ctx, "tcp", addr)
	}
	var conn net.Conn
	err = ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var derr error
		conn, derr = d.DialContext(ctx, "tcp", addr)
		return derr
	})
	if err != nil {
		return nil, fmt.Errorf("dial container %s: %w", id, err)
	}
	return conn, nil
}
