package nodeagent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/ctxwait"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// Container labels the agent sets, and finds its containers by.
const (
	LabelNode     = "voyager.node"
	LabelSession  = "voyager.session"
	LabelOwner    = "voyager.owner"
	LabelRole     = "voyager.role"
	LabelKind     = "voyager.kind"
	LabelQueueRev = "voyager.queue-revision"
)

// GPU modes: how a container gets its GPUs.
const (
	GPUModeCDI = "cdi" // CDI device names <CDIKind>=<uuid>
	GPUModeEnv = "env" // NVIDIA_VISIBLE_DEVICES=<uuids>, for the NVIDIA runtime
)

// Config is what an Agent needs. Zero fields take the defaults noted.
type Config struct {
	// Node is this machine's name in etcd (nodes/<Node>, bindings/<Node>/).
	Node string
	// MPS runs the MPS daemons of the node's shared GPUs (share.go); nil
	// where none is shared, or they are simulated.
	MPS *MPS
	// Address is how other machines and users reach this one (URLs).
	Address string
	Labels  map[string]string
	Keys    state.Keys
	Client  *clientv3.Client
	Runtime runtime.Runtime
	// GPUs is the inventory; Simulated marks one made up by configuration.
	GPUs      []state.GPU
	Simulated bool
	// RecheckGPUs, when set, returns the inventory as it stands now (the
	// GPUs' health, as CheckCDIDevices decides it from specs that may
	// have been written or removed since the start). The agent calls it
	// every GPURecheckEvery and publishes what it returns when that
	// differs from what the node key holds; a re-registration publishes
	// the latest too. Sessions already bound are not touched.
	RecheckGPUs func() []state.GPU
	// GPURecheckEvery is how often RecheckGPUs is called. Default
	// DefaultGPURecheckEvery.
	GPURecheckEvery time.Duration
	CPUMilli        int64
	MemoryMiB       int64
	Ports           state.PortRange
	// LeaseTTL is the node key's lease, in whole seconds (etcd's unit;
	// rounded down). Default 10s. The agent renews it every FenceAfter/3.
	LeaseTTL time.Duration
	// FenceAfter is how long after its last successful renewal (counted
	// from when that renewal was sent, which is no later than etcd
	// extended the lease) an agent that cannot renew its lease fences:
	// it abandons the lease and stops and removes every running container
	// of the node, before etcd can expire the lease and the placers
	// re-queue the sessions elsewhere. Default LeaseTTL/2.
	//
	// Renewals go out every FenceAfter/3, so an etcd that answers no
	// renewal for less than two thirds of FenceAfter (a leader election,
	// which takes etcd one to two election timeouts) never fences,
	// whenever in the cadence it begins.
	FenceAfter time.Duration
	// FenceGrace is the SIGTERM-to-SIGKILL grace of a fence. FenceAfter +
	// FenceGrace must be less than LeaseTTL: what is left is the margin
	// for the kill itself. Default LeaseTTL/5.
	FenceGrace time.Duration
	// Image runs sessions that name none.
	Image string
	// HomeDir holds one home directory per user, mounted at /home/jovyan.
	HomeDir string
	// LogDir holds one log file per container; LogMaxBytes caps each
	// (default 10 MiB).
	LogDir      string
	LogMaxBytes int64
	// LogRetention removes log files of containers that are gone once
	// nothing was written to them this long (the retention of finished
	// sessions); zero keeps them.
	LogRetention time.Duration
	// LogsBaseURL is this agent's HTTP server as the API reaches it
	// (scheme://host:port), where LogsHandler is mounted; with it the agent
	// publishes each session's log URL in status.urls.logs. Empty: no logs
	// are served.
	LogsBaseURL string
	// ProbeHost is where the agent reaches its sessions' published ports
	// (Jupyter's readiness and activity). Default 127.0.0.1.
	ProbeHost string
	// LogURLTTL is how long a published log URL works; the agent re-signs
	// a running session's before it expires, and a finished session's
	// last one works this long after its end. Default LogRetention, else
	// 168h.
	LogURLTTL time.Duration
	// StopGrace is the time between SIGTERM and SIGKILL. Default 10s.
	StopGrace time.Duration
	// StopReportAfter is how long a stop may take before the agent
	// reports its part Stopping: a stop that is done sooner (most
	// containers exit at SIGTERM) is reported only by its end, which
	// saves a part write and its merge. Default DefaultStopReportAfter;
	// negative: Stopping is reported before every stop.
	StopReportAfter time.Duration
	// RunReportAfter is how long a batch part's container that the
	// agent started must run before its part says Running (with the
	// time it started): one that ends sooner (a quick job, a command
	// that fails at once) is reported by its end alone, which carries
	// the start, one part write and merge fewer. Notebooks say Running
	// as soon as Jupyter answers. Default DefaultRunReportAfter;
	// negative: at once.
	RunReportAfter time.Duration
	// StartTimeout is how long after its bind a part may take to run
	// (pull, create, readiness) before it ends StartFailed, saying which
	// stage it was stuck at (startdeadline.go). Zero: no deadline.
	StartTimeout time.Duration
	// UID and GID run session containers. Default runtime.DefaultUID/GID.
	UID, GID *uint32
	// GPUMode is GPUModeCDI (default) or GPUModeEnv; CDIKind defaults to
	// "nvidia.com/gpu".
	GPUMode string
	CDIKind string
	// PidsLimit caps processes per container (default 4096); ShmMiB sizes
	// /dev/shm (default 1024, at most the session's memory).
	PidsLimit int64
	ShmMiB    int64
	// Version is written to the node record.
	Version string
	Logger  *slog.Logger
	// Resync is how often the agent reconciles without a change. Default 30s.
	Resync time.Duration
	// Usage samples GPU utilisation and memory in use for metrics
	// (ReadNVMLUsage on a machine with NVML); nil: none.
	Usage func() ([]GPUUsage, error)

	// ActivityEvery is how often the agent samples each running session
	// whose head (or single) part runs here: Jupyter's activity and its
	// GPUs' use, written to its status when it changed meaningfully.
	// Default 30s.
	ActivityEvery time.Duration
	// GPUSampler reads the use of a session's GPUs: NewNVMLSampler on a
	// machine with NVML. Nil: a SimulatedSampler over Runtime when the
	// inventory is Simulated, else no GPU sampling.
	GPUSampler GPUSampler
	// GPUBusyPercent is the utilisation at or above which a GPU counts as
	// activity. Default 10.
	GPUBusyPercent int
	// GPUUnusedAfter is how long a GPU with no process and no utilisation
	// stays idle before it is flagged unused. Default 30m.
	GPUUnusedAfter time.Duration
	// RestartBackoff is the first restart delay of a failed OnFailure
	// batch session that names none; it doubles each restart, up to
	// RestartBackoffMax. Defaults 10s and 10m.
	RestartBackoff    time.Duration
	RestartBackoffMax time.Duration
	// JobRoutes is how a multi-node job's parts reach each other's
	// containers at their own addresses on an isolated network:
	// JobRoutesDirect (the default), JobRoutesFabric or JobRoutesOff.
	JobRoutes string
	// FenceDir is the fence directory shared with the node's fence keeper
	// (package fence): the agent writes its heartbeat there after every
	// renewal and whenever the node's containers change, and a record per
	// container it fences. Empty: no heartbeat (nothing fences the node
	// when the agent cannot) and fence records are kept in memory only.
	FenceDir string
	// ParkOnShutdown is set where the node's lease cannot expire while
	// the agent is down: voyager dev, whose embedded etcd stops with it.
	// A clean shutdown then parks the heartbeat (fence.Heartbeat.Parked)
	// and the containers stay for the next start to adopt, as they did
	// before the fence keeper; a kill or a pause is fenced all the same.
	ParkOnShutdown bool
}

// How a multi-node job's parts reach each other (Config.JobRoutes).
const (
	// JobRoutesDirect routes each peer node's container subnet through
	// that node's address: the nodes share a link.
	JobRoutesDirect = "direct"
	// JobRoutesFabric adds no routes: the network between the nodes
	// routes container subnets itself.
	JobRoutesFabric = "fabric"
	// JobRoutesOff gives parts no path to each other's containers: only
	// each other's published MASTER_PORT and peer ports.
	JobRoutesOff = "off"
)

func (c *Config) defaults() {
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 10 * time.Second
	}
	if c.JobRoutes == "" {
		c.JobRoutes = JobRoutesDirect
	}
	// etcd grants whole seconds: the fence timings count from what it grants.
	c.LeaseTTL = max(c.LeaseTTL.Truncate(time.Second), time.Second)
	if c.FenceAfter <= 0 {
		c.FenceAfter = c.LeaseTTL / 2
	}
	if c.FenceGrace <= 0 {
		c.FenceGrace = c.LeaseTTL / 5
	}
	if c.LogMaxBytes <= 0 {
		c.LogMaxBytes = 10 << 20
	}
	if c.StopGrace <= 0 {
		c.StopGrace = 10 * time.Second
	}
	if c.StopReportAfter == 0 {
		c.StopReportAfter = DefaultStopReportAfter
	}
	if c.RunReportAfter == 0 {
		c.RunReportAfter = DefaultRunReportAfter
	}
	if c.ProbeHost == "" {
		c.ProbeHost = "127.0.0.1"
	}
	if c.LogURLTTL <= 0 {
		c.LogURLTTL = cmp.Or(c.LogRetention, 168*time.Hour)
	}
	if c.GPUMode == "" {
		c.GPUMode = GPUModeCDI
	}
	if c.CDIKind == "" {
		c.CDIKind = DefaultCDIKind
	}
	if c.PidsLimit <= 0 {
		c.PidsLimit = 4096
	}
	if c.ShmMiB <= 0 {
		c.ShmMiB = 1024
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Resync <= 0 {
		c.Resync = 30 * time.Second
	}
	if c.ActivityEvery <= 0 {
		c.ActivityEvery = 30 * time.Second
	}
	if c.GPURecheckEvery <= 0 {
		c.GPURecheckEvery = DefaultGPURecheckEvery
	}
	if c.GPUSampler == nil && c.Simulated && c.Runtime != nil {
		c.GPUSampler = NewSimulatedSampler(c.Runtime)
	}
	if c.GPUBusyPercent <= 0 {
		c.GPUBusyPercent = 10
	}
	if c.GPUUnusedAfter <= 0 {
		c.GPUUnusedAfter = 30 * time.Minute
	}
	if c.RestartBackoff <= 0 {
		c.RestartBackoff = 10 * time.Second
	}
	if c.RestartBackoffMax <= 0 {
		c.RestartBackoffMax = 10 * time.Minute
	}
}

// errLeaseLost ends the work of one lease: etcd says it has expired.
var errLeaseLost = errors.New("node lease lost")

// errFenced ends the work of one lease that could not be renewed within
// FenceAfter: it may expire any moment, and the node's containers go.
var errFenced = errors.New("node lease not renewed in time; fenced")

// errUnbound cancels a session's worker whose binding is gone: the worker
// then stops and removes the container, and writes nothing to etcd.
var errUnbound = errors.New("binding removed")

// Agent keeps one node registered and its containers matching its bindings.
type Agent struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	workers map[string]*worker // by container id
	reaping map[string]bool    // container ids being removed as orphans
	// released holds, by container id, the create revision of a binding
	// whose worker released it: until the watch shows the binding gone,
	// reconcile must not start its session again.
	released map[string]int64
	poke     chan struct{}
	// fenceNotes holds, by container id, why the agent's own fence
	// stopped it (also in FenceDir's records, when set), until the
	// container is removed after its attempt was reported.
	fenceNotes map[string]string
	// registered is when the current lease was registered; fencedRenewal
	// the send of the last renewal before the latest fence: between them,
	// the outage as the agent saw it.
	registered, fencedRenewal time.Time
	wg                        sync.WaitGroup
	epochs                    int
	leased                    bool
	// gpus is the inventory the node key holds (or the next registration
	// writes): Config.GPUs, as RecheckGPUs last changed it.
	gpus []state.GPU

	// runCtx is the context Run was given: ended, the agent is stopping
	// (a graceful stop, not a fence).
	runCtx atomic.Pointer[context.Context]

	starts, adopted, startFailures  atomic.Int64
	fences, fenced                  atomic.Int64 // fences, and containers they stopped
	fencedAttempts                  atomic.Int64 // attempts ended because their containers were fenced
	hb                              heartbeat
	renewed                         atomic.Int64 // unix nanoseconds of the last successful renewal's send
	activitySamples, activityWrites atomic.Int64
	logKey                          logKey
	lastPrune                       time.Time                      // of the log directory; owned by the work loop
	gpuActivity                     map[string][]state.GPUActivity // by session: the latest sample, for metrics
}

// New returns an agent; Run starts it.
func New(cfg Config) *Agent {
	cfg.defaults()
	return &Agent{
		cfg:         cfg,
		log:         cfg.Logger.With("component", "agent", "node", cfg.Node),
		workers:     map[string]*worker{},
		reaping:     map[string]bool{},
		released:    map[string]int64{},
		poke:        make(chan struct{}, 1),
		fenceNotes:  map[string]string{},
		gpuActivity: map[string][]state.GPUActivity{},
		gpus:        cfg.GPUs,
	}
}

// Registrations counts the leases the agent has registered under: more
// than one means it lost a lease and registered again.
func (a *Agent) Registrations() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.epochs
}

// Registered reports whether the agent holds a live lease now.
func (a *Agent) Registered() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.leased
}

// Renewed returns when the last successful renewal of the node's lease
// was sent (the registration counts as one): etcd's lease runs at least
// the TTL from then. It is the zero time before the first registration.
func (a *Agent) Renewed() time.Time {
	if r := a.renewed.Load(); r > 0 {
		return time.Unix(0, r)
	}
	return time.Time{}
}

// Fences counts the fences: leases the agent gave up because it could not
// renew them in time, stopping the node's containers.
func (a *Agent) Fences() int64 { return a.fences.Load() }

// Run registers the node and reconciles until ctx ends. A lease that could
// not be renewed within FenceAfter, or that expired, ends the current work
// and fences the node (its running containers are stopped and removed: the
// placers re-queue or end their sessions once the lease expires); then the
// agent registers again. Run returns nil when ctx ends, after its workers
// have returned; a shutdown leaves the containers running for the next
// agent to adopt.
func (a *Agent) Run(ctx context.Context) error {
	if err := state.ValidateName("node name", a.cfg.Node); err != nil {
		return fmt.Errorf("run agent: %w", err)
	}
	if a.cfg.FenceAfter+a.cfg.FenceGrace >= a.cfg.LeaseTTL {
		return fmt.Errorf("run agent: fence after %s plus fence grace %s must be less than the lease TTL %s, or the node's containers outlive its lease",
			a.cfg.FenceAfter, a.cfg.FenceGrace, a.cfg.LeaseTTL)
	}
	a.runCtx.Store(&ctx)
	defer a.wg.Wait()
	a.seedBeat()
	backoff := 200 * time.Millisecond
	for ctx.Err() == nil {
		leaseCtx, cancel, err := a.register(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			a.log.Warn("register node; retrying", "err", err, "in", backoff)
			if !ctxwait.Sleep(ctx, backoff) {
				break
			}
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		backoff = 200 * time.Millisecond
		a.work(leaseCtx)
		cause := context.Cause(leaseCtx)
		cancel(nil)
		if ctx.Err() == nil {
			a.log.Warn("lost the node lease; registering again", "cause", cause)
		}
	}
	if a.cfg.ParkOnShutdown {
		a.wg.Wait() // no renewal writes a heartbeat after this
		a.park()
	}
	return nil
}
func (a *Agent) kick() {
	select {
	case a.poke <- struct{}{}:
	default:
	}
}

// ContainerID names the container of a binding: one per session and
// queueing, so a session re-queued and bound here again gets a new one.
func ContainerID(b state.Binding) string {
	return fmt.Sprintf("%s-q%d", b.Session, b.QueueRevision)
}

// reconcile cancels the workers of bindings that are gone, removes
// containers that belong to no binding and no worker (orphans), and starts
// a worker for every binding without one — but only once no orphan is
// left: an orphan may hold GPUs, CPU or ports that the ledger has already
// given to a new binding. A re-registering agent (after a fence, a lost
// lease or a restart) thus clears what it must not run before it runs
// anything new.
func (a *Agent) reconcile(ctx context.Context, snap *watcher.Snapshot[state.Binding]) {
	want := map[string]watcher.Item[state.Binding]{}
	for _, it := range snap.List() {
		if it.Value.Session == "" || it.Value.Node != a.cfg.Node {
			a.log.Warn("ignoring a malformed binding", "key", it.Key)
			continue
		}
		want[ContainerID(it.Value)] = it
	}
	a.mu.Lock()
	for id, w := range a.workers {
		if it, ok := want[id]; !ok || it.CreateRevision != w.item.CreateRevision {
			w.cancel(errUnbound)
		}
	}
	a.mu.Unlock()

	a.reconcileMPS(ctx, want)

	// What runs here decides what may start: no list, no new workers.
	infos, err := a.cfg.Runtime.List(ctx, map[string]string{LabelNode: a.cfg.Node})
	if err != nil {
		if ctx.Err() == nil {
			a.log.Warn("list containers; starting nothing until it answers", "err", err)
		}
		return
	}
	// The keeper must know every container that runs or may start before
	// the next heartbeat: those listed, and those of the bindings.
	a.beatContainers(want, infos)
	if a.cfg.LogRetention > 0 && time.Since(a.lastPrune) >= logPruneEvery {
		a.lastPrune = time.Now()
		live := make(map[string]bool, len(want)+len(infos))
		for id := range want {
			live[id] = true
		}
		for _, in := range infos {
			live[in.ID] = true
		}
		if n, err := a.pruneLogs(a.lastPrune, live); err != nil {
			a.log.Warn("prune session logs", "err", err)
		} else if n > 0 {
			a.log.Info("removed old session logs", "files", n, "olderThan", a.cfg.LogRetention)
		}
		if _, err := a.pruneReports(live); err != nil {
			a.log.Warn("prune goodput report directories", "err", err)
		}
		if n, err := a.pruneSecrets(ctx); err != nil {
			a.log.Warn("prune session secrets", "err", err)
		} else if n > 0 {
			a.log.Info("removed the secrets of retired sessions", "sessions", n)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, in := range infos {
		if _, bound := want[in.ID]; bound || a.workers[in.ID] != nil || a.reaping[in.ID] {
			continue
		}
		// Bound to nothing and nobody's: an orphan (its binding went while
		// the agent was down). Stop it; it must not outlive its allocation.
		a.reaping[in.ID] = true
		a.log.Info("removing a container that is no longer bound", "container", in.ID, "session", in.Labels[LabelSession])
		a.wg.Go(func() {
			a.removeContainer(context.WithoutCancel(ctx), in.ID)
			a.mu.Lock()
			delete(a.reaping, in.ID)
			a.mu.Unlock()
			a.kick() // the bindings that waited may start now
		})
	}
	for id, rev := range a.released {
		if it, ok := want[id]; !ok || it.CreateRevision != rev {
			delete(a.released, id) // the watch caught up
		}
	}
	if len(a.reaping) > 0 {
		return
	}
	for id, it := range want {
		if _, running := a.workers[id]; running {
			continue
		}
		if a.released[id] == it.CreateRevision {
			continue // released; the snapshot lags the release
		}
		w := a.newWorker(ctx, id, it)
		a.workers[id] = w
		a.wg.Go(func() {
			w.run()
			a.mu.Lock()
			if a.workers[id] == w {
				delete(a.workers, id)
			}
			a.mu.Unlock()
			a.kick()
		})
	}
}

// markReleased records that the binding of container id, created at
// rev, was released: a snapshot that still shows it starts nothing.
func (a *Agent) markReleased(id string, rev int64) {
	a.mu.Lock()
	a.released[id] = rev
	a.mu.Unlock()
}

// stopWorkers cancels every worker with cause and waits for them.
func (a *Agent) stopWorkers(cause error) {
	for _, w := range a.cancelWorkers(cause) {
		<-w.done
	}
}

// cancelWorkers cancels every worker with cause and returns them.
func (a *Agent) cancelWorkers(cause error) map[string]*worker {
	a.mu.Lock()
	ws := maps.Clone(a.workers)
	a.mu.Unlock()
	for _, w := range ws {
		w.cancel(cause)
	}
	return ws
}

// removeContainer stops (SIGTERM, grace, SIGKILL) and removes a container.
func (a *Agent) removeContainer(ctx context.Context, id string) {
	if err := a.cfg.Runtime.Stop(ctx, id, a.cfg.StopGrace); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		a.log.Warn("stop container", "container", id, "err", err)
	}
	if err := a.cfg.Runtime.Remove(ctx, id); err != nil {
		a.log.Warn("remove container", "container", id, "err", err)
	} else {
		if path := a.hostfilePath(id); path != "" {
			_ = os.Remove(path) // a multi-node job's part's, if any
		}
		a.forgetFenced(id)
	}
}
