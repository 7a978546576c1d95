package runtime

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Sentinel errors shared by every implementation.
var (
	// ErrNotFound means no container has the id.
	ErrNotFound = errors.New("container not found")
	// ErrExists means a container with the id already exists.
	ErrExists = errors.New("container already exists")
	// ErrImageNotFound means the image is not present and could not be pulled.
	ErrImageNotFound = errors.New("image not found")
	// ErrImageNotImported means an image under LocalRegistry is absent:
	// it is imported, never pulled. It wraps ErrImageNotFound.
	ErrImageNotImported = fmt.Errorf("not imported (images under %s/ are imported, never pulled): %w", LocalRegistry, ErrImageNotFound)
	// ErrInvalidSpec means a Spec failed Validate.
	ErrInvalidSpec = errors.New("invalid container spec")
	// ErrNetworkSetup means the isolated network could not be set up
	// (a CNI plugin or iptables missing): containerd itself answered.
	ErrNetworkSetup = errors.New("cannot set up the sessions' network")
)

// Runtime runs containers. Implementations are safe for concurrent use.
//
// The contract (checked by runtimetest.Run against every implementation):
// Start creates and starts a container, and fails with ErrExists when the id
// is taken, so a caller that retries never gets a duplicate. Stop and Remove
// are idempotent. A stopped container keeps its exit code until Remove.
type Runtime interface {
	// EnsureImage makes ref available locally, pulling it if absent.
	EnsureImage(ctx context.Context, ref string) error
	// Start creates the container described by spec and starts its process.
	// A container that was created but failed to start is removed again.
	Start(ctx context.Context, spec Spec) error
	// Stop ends the container's process: SIGTERM, then SIGKILL if it has not
	// exited after grace. The container stays, Stopped, with its exit code.
	// Stopping a stopped container does nothing; an unknown id is ErrNotFound.
	Stop(ctx context.Context, id string, grace time.Duration) error
	// Remove deletes the container and its writable layer. Removing a
	// running container kills it first; an unknown id is not an error.
	Remove(ctx context.Context, id string) error
	// Status returns what the runtime knows of one container, or ErrNotFound.
	Status(ctx context.Context, id string) (Info, error)
	// Wait blocks until the container's process exits and returns its exit
	// code, at once if it already has. It fails when ctx ends first.
	Wait(ctx context.Context, id string) (int, error)
	// List returns the containers whose labels include every entry of
	// labels (all containers for an empty map), sorted by id.
	List(ctx context.Context, labels map[string]string) ([]Info, error)
	// CPUUsage returns the CPU time the container's processes have used
	// since it started (user and system, all cores; from its cgroup). It
	// only grows while the container runs. An unknown id is ErrNotFound;
	// a container whose process has exited may report an error.
	CPUUsage(ctx context.Context, id string) (time.Duration, error)
}

// LoopbackDialer is a Runtime that can connect to a port on a container's
// own loopback (Containerd; not the fake, which runs no process).
type LoopbackDialer interface {
	DialLoopback(ctx context.Context, id string, port int) (net.Conn, error)
}

// ProcessLister is a Runtime that can list a container's processes
// (Containerd and Fake): what a sampler of a shared GPU needs to tell a
// session's own processes on it from its neighbours'.
type ProcessLister interface {
	// Pids returns the host process ids of every process of the
	// container (its cgroup's), sorted; an unknown id is ErrNotFound, a
	// container without a running process has none.
	Pids(ctx context.Context, id string) ([]uint32, error)
}

// State is a container's lifecycle state.
type State string

// Container states.
const (
	StateCreated State = "created" // exists, process never started (its creator may have died before starting it)
	StateRunning State = "running" // process running
	StateStopped State = "stopped" // process ran and exited (exit code -1 if its end was not recorded)
)

// Info is what the runtime reports of one container.
type Info struct {
	ID     string
	Image  string
	Labels map[string]string
	State  State
	// ExitCode is the process's exit status once State is StateStopped
	// (128+signal for a signalled process); -1 when unknown.
	ExitCode int
	// Pid is the process id on the host while running, else 0.
	Pid uint32
	// LogPath is the file that receives the process's stdout and stderr.
	LogPath string
	// Started is when the process started, zero if unknown.
	Started time.Time
	// IP is the container's own address when it has its own network
	// (NetworkIsolated); empty on the host's network.
	IP string
}

// Mount is a host directory bind-mounted into the container.
type Mount struct {
	// Source is the host directory. With Create it is made (and owned by
	// the spec's user) when missing.
	Source string
	// Target is the path inside the container.
	Target   string
	ReadOnly bool
	// Create makes Source, owned by the container's UID and GID, mode
	// 0700, if it does not exist; an existing one is given to them (all of
	// it, when its owner differs) and made 0700.
	Create bool
	// Private, with Create, never hands an existing Source over: one not
	// owned by the container's UID fails the start (a per-user volume
	// whose path meets a directory that is someone else's).
	Private bool
}

// Spec describes one container. The container runs on the runtime's
// network (the host's, or a namespace of its own: NetworkOptions; the
// caller allocates its ports either way), without privilege under the
// default seccomp profile and capability set, and as UID/GID, which
// default to DefaultUID/DefaultGID: never root unless asked for.
type Spec struct {
	// ID names the container: 1-76 letters, digits, '_', '.' or '-'.
	ID    string
	Image string
	// Args replaces the image's command; empty keeps the image's.
	Args []string
	// Env is added to the image's environment; secrets belong here, never
	// in Args, which any user of the host can read in the process table.
	Env    map[string]string
	Labels map[string]string
	// WorkDir is the process's working directory; empty keeps the image's.
	WorkDir string
	// UID and GID run the process; nil means DefaultUID and DefaultGID.
	UID, GID *uint32
	// CPUMilli caps CPU in thousandths of a core (CFS quota); 0: no cap.
	CPUMilli int64
	// MemoryBytes caps memory (cgroup limit); 0: no cap.
	MemoryBytes int64
	// PidsLimit caps the number of processes; 0: no cap.
	PidsLimit int64
	// ShmBytes sizes /dev/shm; 0 keeps the default 64 MiB.
	ShmBytes int64
	// Rlimits set resource limits of the container's processes; a type
	// left out keeps the runtime's default (containerd's: RLIMIT_NOFILE
	// 1024). Containerd lowers a limit this host cannot grant to the
	// most it can (Grantable) rather than fail the start.
	Rlimits []Rlimit
	Mounts  []Mount
	// CDIDevices are fully qualified CDI device names
	// ("nvidia.com/gpu=0") injected from the runtime's CDI spec dirs.
	CDIDevices []string
	// Publish are the ports reachable from outside the node, on the node's
	// addresses at the same numbers, when the container has its own
	// network. On the host's network every port it listens on is open.
	Publish []Published
	// Reach are endpoints the container may reach although its network
	// blocks their ports (NetworkOptions.BlockedPorts).
	Reach []Endpoint
	// DenyEgress refuses every connection the container opens but to
	// EgressAllow's networks, Reach's endpoints and the network's Allow
	// endpoints; replies to connections made to it still flow. It needs
	// a network of the container's own (NetworkIsolated): Start refuses it
	// on the host's.
	DenyEgress bool
	// EgressAllow are IPv4 networks in CIDR form ("10.0.0.0/8") a
	// container with DenyEgress still reaches.
	EgressAllow []string
	// LogPath receives stdout and stderr, appended; its directory is
	// created. Empty discards output. TrimLog keeps its size bounded.
	LogPath string
	// Mesh, when set, is called once the container has its own address
	// and before its process starts, with that address; it returns the
	// containers (of other nodes) this one exchanges TCP with directly,
	// on any port, at their own addresses: a multi-node job's other
	// parts, whose libraries (NCCL, Gloo) advertise the address they see
	// and ports the kernel chose. An error fails the start. Only a
	// network of the container's own honours it (NetworkIsolated); on
	// the host's every address is reachable already, and Mesh is not
	// called.
	Mesh func(ctx context.Context, addr string) ([]MeshPeer, error)
}

// MeshPeer is a container on another node that a container exchanges TCP
// with directly (Spec.Mesh).
type MeshPeer struct {
	// Addr is the peer container's own IPv4 address.
	Addr string
	// Subnet is its node's container subnet (CIDR) and Via its node's
	// address: the route to the peer. Empty Via: the network between the
	// nodes routes container subnets itself (no route is added).
	Subnet, Via string
}

// Rlimit is one resource limit of a container's processes.
type Rlimit struct {
	// Type is the limit's name as in the OCI spec and setrlimit(2),
	// such as RLIMIT_NOFILE or RLIMIT_MEMLOCK.
	Type string
	// Soft and Hard are the limits; RlimitInfinity is unlimited.
	Soft, Hard uint64
}

// RlimitInfinity is an unlimited Rlimit value (RLIM_INFINITY).
const RlimitInfinity = ^uint64(0)

// DefaultUID and DefaultGID run a container whose Spec leaves UID and GID
// nil: Jupyter's conventional unprivileged user.
const (
	DefaultUID uint32 = 1000
	DefaultGID uint32 = 100
)

var idRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,75}$`)

// Validate checks what every implementation requires of a spec.
func (s Spec) Validate() error {
	if !idRE.MatchString(s.ID) {
		return fmt.Errorf("%w: id %q: want 1-76 letters, digits, '_', '.' or '-'", ErrInvalidSpec, s.ID)
	}
	if s.Image == "" {
		return fmt.Errorf("%w: container %s has no image", ErrInvalidSpec, s.ID)
	}
	if s.CPUMilli < 0 || s.MemoryBytes < 0 || s.PidsLimit < 0 || s.ShmBytes < 0 {
		return fmt.Errorf("%w: container %s has a negative limit", ErrInvalidSpec, s.ID)
	}
	for _, c := range s.EgressAllow {
		if p, err := netip.ParsePrefix(c); err != nil || !p.Addr().Is4() {
			return fmt.Errorf("%w: container %s: egress network %q: want an IPv4 network such as 10.0.0.0/8", ErrInvalidSpec, s.ID, c)
		}
	}
	for _, r := range s.Rlimits {
		if _, ok := rlimitResources[r.Type]; !ok || r.Soft > r.Hard {
			return fmt.Errorf("%w: container %s: rlimit %s %d:%d: want one of %s with soft at most hard", ErrInvalidSpec, s.ID, r.Type, r.Soft, r.Hard, strings.Join(slices.Sorted(maps.Keys(rlimitResources)), ", "))
		}
	}
	for _, m := range s.Mounts {
		if m.Source == "" || m.Target == "" || m.Target[0] != '/' {
			return fmt.Errorf("%w: container %s: mount %q→%q needs a source and an absolute target", ErrInvalidSpec, s.ID, m.Source, m.Target)
		}
	}
	return nil
}

// User returns the UID and GID the container runs as.
func (s Spec) User() (uid, gid uint32) {
	uid, gid = DefaultUID, DefaultGID
	if s.UID != nil {
		uid = *s.UID
	}
	if s.GID != nil {
		gid = *s.GID
	}
	return uid, gid
}

// matches reports whether have holds every entry of want.
func matches(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

func cloneLabels(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return maps.Clone(m)
}

// LocalRegistry is the registry part of the images Voyager builds and
// imports itself (voyager.local/busybox, voyager.local/jupyter). No
// registry of that name exists: such an image is never pulled, so nothing
// asks a DNS server or a registry about it.
const LocalRegistry = "voyager.local"

// IsLocalImage reports whether ref names an image under LocalRegistry,
// in any case: a registry's name is a DNS name, so VOYAGER.LOCAL/x is
// never pulled either.
func IsLocalImage(ref string) bool {
	return len(ref) > len(LocalRegistry) && strings.EqualFold(ref[:len(LocalRegistry)+1], LocalRegistry+"/")
}

func notImported(ref, namespace string) error {
	return fmt.Errorf("image %s (containerd namespace %s): %w; voyager dev imports voyager.local/busybox, make image builds and loads voyager.local/jupyter", ref, namespace, ErrImageNotImported)
}
