package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
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
	// LabelToken keeps the Jupyter token with the container, so an agent
	// that adopts it after a restart can still give out its URL. Only root
	// on the node can read labels, as it can read the environment.
	LabelToken = "voyager.token"
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
	// Address is how other machines and users reach this one (URLs).
	Address string
	Labels  map[string]string
	Keys    state.Keys
	Client  *clientv3.Client
	Runtime runtime.Runtime
	// GPUs is the inventory; Simulated marks one made up by configuration.
	GPUs      []state.GPU
	Simulated bool
	CPUMilli  int64
	MemoryMiB int64
	Ports     state.PortRange
	// LeaseTTL is the node key's lease. Default 10s.
	LeaseTTL time.Duration
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
	// StopGrace is the time between SIGTERM and SIGKILL. Default 10s.
	StopGrace time.Duration
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
}

func (c *Config) defaults() {
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 10 * time.Second
	}
	if c.LogMaxBytes <= 0 {
		c.LogMaxBytes = 10 << 20
	}
	if c.StopGrace <= 0 {
		c.StopGrace = 10 * time.Second
	}
	if c.GPUMode == "" {
		c.GPUMode = GPUModeCDI
	}
	if c.CDIKind == "" {
		c.CDIKind = "nvidia.com/gpu"
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

// errLeaseLost ends the work of one lease.
var errLeaseLost = errors.New("node lease lost")

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
	poke    chan struct{}
	wg      sync.WaitGroup
	epochs  int
	leased  bool

	starts, adopted, startFailures  atomic.Int64
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
		poke:        make(chan struct{}, 1),
		gpuActivity: map[string][]state.GPUActivity{},
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

// Run registers the node and reconciles until ctx ends. A lost lease ends
// the current work (never the containers) and registers again. Run returns
// nil when ctx ends, after its workers have returned.
func (a *Agent) Run(ctx context.Context) error {
	if err := state.ValidateName("node name", a.cfg.Node); err != nil {
		return fmt.Errorf("run agent: %w", err)
	}
	defer a.wg.Wait()
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
			a.log.Warn("lost the node lease; containers keep running; registering again", "cause", cause)
		}
	}
	return nil
}

// register grants a lease, writes the node record under it and keeps it
// alive. The returned context ends when the lease is lost.
func (a *Agent) register(ctx context.Context) (context.Context, context.CancelCauseFunc, error) {
	cli := a.cfg.Client
	ttl := max(int64(a.cfg.LeaseTTL/time.Second), 1)
	gctx, gcancel := context.WithTimeout(ctx, a.cfg.LeaseTTL)
	defer gcancel()
	lease, err := cli.Grant(gctx, ttl)
	if err != nil {
		return nil, nil, fmt.Errorf("grant lease: %w", err)
	}
	node := state.Node{
		Name: a.cfg.Node, Address: a.cfg.Address, Labels: a.cfg.Labels,
		CPUMilli: a.cfg.CPUMilli, MemoryMiB: a.cfg.MemoryMiB, GPUs: a.cfg.GPUs, Ports: a.cfg.Ports,
		Simulated: a.cfg.Simulated, Agent: a.cfg.Version, Registered: time.Now().UTC(),
	}
	if node.GPUs == nil {
		node.GPUs = []state.GPU{}
	}
	v, err := state.Encode(node)
	if err != nil {
		return nil, nil, fmt.Errorf("register node: %w", err)
	}
	if _, err := cli.Put(gctx, a.cfg.Keys.Node(a.cfg.Node), v, clientv3.WithLease(lease.ID)); err != nil {
		return nil, nil, fmt.Errorf("register node: %w", err)
	}
	leaseCtx, cancel := context.WithCancelCause(ctx)
	ka, err := cli.KeepAlive(leaseCtx, lease.ID)
	if err != nil {
		cancel(err)
		return nil, nil, fmt.Errorf("keep lease alive: %w", err)
	}
	a.wg.Go(func() {
		for range ka { // drained until the client gives up on the lease
		}
		a.mu.Lock()
		a.leased = false
		a.mu.Unlock()
		cancel(errLeaseLost)
	})
	a.mu.Lock()
	a.epochs++
	a.leased = true
	a.mu.Unlock()
	a.log.Info("node registered", "lease", fmt.Sprintf("%x", lease.ID), "ttl", a.cfg.LeaseTTL,
		"gpus", len(a.cfg.GPUs), "simulated", a.cfg.Simulated)
	return leaseCtx, cancel, nil
}

// work reconciles until ctx (the lease) ends, then waits for every worker
// of this lease.
func (a *Agent) work(ctx context.Context) {
	bindings := watcher.New(a.cfg.Client, a.cfg.Keys.Bindings(a.cfg.Node), watcher.JSON[state.Binding],
		watcher.Options{Name: "bindings", Logger: a.log})
	bindings.AddHandler(func(watcher.Event[state.Binding]) { a.kick() })
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { _ = bindings.Run(ctx) })
	if err := bindings.WaitSynced(ctx); err != nil {
		return
	}
	tick := time.NewTicker(a.cfg.Resync)
	defer tick.Stop()
	for {
		a.reconcile(ctx, bindings.Snapshot())
		select {
		case <-ctx.Done():
			a.stopWorkers(context.Cause(ctx))
			return
		case <-a.poke:
		case <-tick.C:
		}
	}
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

// reconcile starts a worker for every binding without one, cancels the
// workers of bindings that are gone, and removes containers that belong to
// no binding and no worker.
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
	for id, it := range want {
		if _, running := a.workers[id]; running {
			continue
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
	a.mu.Unlock()

	infos, err := a.cfg.Runtime.List(ctx, map[string]string{LabelNode: a.cfg.Node})
	if err != nil {
		if ctx.Err() == nil {
			a.log.Warn("list containers", "err", err)
		}
		return
	}
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
		})
	}
}

// stopWorkers cancels every worker with cause and waits for them.
func (a *Agent) stopWorkers(cause error) {
	a.mu.Lock()
	ws := maps.Clone(a.workers)
	a.mu.Unlock()
	for _, w := range ws {
		w.cancel(cause)
	}
	for _, w := range ws {
		<-w.done
	}
}

// removeContainer stops (SIGTERM, grace, SIGKILL) and removes a container.
func (a *Agent) removeContainer(ctx context.Context, id string) {
	if err := a.cfg.Runtime.Stop(ctx, id, a.cfg.StopGrace); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		a.log.Warn("stop container", "container", id, "err", err)
	}
	if err := a.cfg.Runtime.Remove(ctx, id); err != nil {
		a.log.Warn("remove container", "container", id, "err", err)
	}
}
