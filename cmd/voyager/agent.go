package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/internal/ctxwait"
	"github.com/voyager-gpu/voyager/internal/httpserver"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// agentEnvs are the settings the node agent reads.
var agentEnvs = []string{
	config.EnvAgentNode, config.EnvAgentAddress, config.EnvAgentContainerd, config.EnvAgentNamespace,
	config.EnvAgentLeaseTTL, config.EnvAgentFenceAfter, config.EnvAgentFenceGrace, config.EnvAgentSimulateGPUs, config.EnvAgentGPUMode, config.EnvAgentCDISpecDirs,
	config.EnvAgentImage, config.EnvAgentPorts, config.EnvAgentStopGrace, config.EnvAgentHomeDir,
	config.EnvAgentUID, config.EnvAgentGID, config.EnvAgentLogMaxMiB,
	config.EnvAgentNetwork, config.EnvAgentNetworkName, config.EnvAgentNetworkSubnet, config.EnvAgentNetworkDeny,
	config.EnvAgentNetworkAllow, config.EnvAgentDenyControl, config.EnvAgentJobRoutes, config.EnvAgentCNIPluginDirs, config.EnvAgentFenceKeeper,
	config.EnvAgentActivityEvery, config.EnvAgentGPUBusyPercent, config.EnvAgentGPUUnusedAfter,
	config.EnvRestartBackoff, config.EnvRestartBackoffMax, config.EnvRetention, config.EnvStartTimeout,
}

const agentLong = `Runs the node agent of this machine until SIGINT or SIGTERM: it registers
the machine's GPUs (from NVML, or made up by VOYAGER_AGENT_SIMULATE_GPUS) under
a lease, and runs in containerd exactly the sessions bound to this node. Run one
per GPU machine, as root. Stopping it leaves the containers running; started
again, it adopts them. Cut off from etcd for VOYAGER_AGENT_FENCE_AFTER (half
the lease), it stops and removes the node's containers before its lease can
expire and the sessions run elsewhere (fencing). It serves /healthz, /readyz and /metrics on
VOYAGER_HTTP_ADDR.`

func newAgentCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "agent",
		Short:   "Run the node agent of this GPU machine: its GPUs, its containers",
		Long:    agentLong,
		GroupID: groupProcesses,
		Args:    cobra.NoArgs,
		RunE:    runAgent,
	}
	return withSettings(cmd, append([]string{
		config.EnvEtcdEndpoints, config.EnvEtcdPrefix, config.EnvEtcdDialTimeout, config.EnvDataDir,
		config.EnvHTTPAddr, config.EnvLogLevel, config.EnvLogFormat,
	}, append(agentEnvs, secureEnvs...)...)...)
}

func runAgent(cmd *cobra.Command, _ []string) error {
	cfg, err := loadClusterConfig(cmd)
	if err != nil {
		return err
	}
	return runProcess(cmd, "agent", cfg, func(p *process) ([]component, error) {
		parts, err := newAgent(p.ctx, p.cli, cfg, p.log, false)
		if err != nil {
			return nil, err
		}
		p.onExit(parts.close)
		mux := http.NewServeMux()
		registry := httpserver.NewRegistry()
		registry.MustRegister(parts.agent.Collectors()...)
		httpserver.Routes(mux, etcdProbes(registry, p.cli, cfg.EtcdPrefix))
		mux.Handle(nodeagent.LogsPath, parts.agent.LogsHandler())
		mux.Handle(nodeagent.DashboardPath, parts.agent.DashboardHandler())
		mux.Handle(nodeagent.ExecPath, parts.agent.ExecHandler())
		mux.Handle(nodeagent.ForwardPath, parts.agent.ForwardHandler())
		hs, err := listenHTTP(cfg, mux, p.log)
		if err != nil {
			return nil, err
		}
		p.log.Info("http listening", "addr", hs.Addr())
		comps, err := agentControlPlane(p.ctx, p.cli, cfg, parts, hs.Addr(), p.log)
		if err != nil {
			return nil, err
		}
		return append([]component{httpComponent(hs), parts.component()}, comps...), nil
	})
}

// agentParts is an agent with what it owns: the runtime connection and,
// in dev, a private containerd.
type agentParts struct {
	agent  *nodeagent.Agent
	rt     *runtime.Containerd
	daemon *runtime.Daemon
	nvml   *nodeagent.NVMLSampler
	// keeper checks that a fence keeper watches the node (and starts one
	// when VOYAGER_AGENT_FENCE_KEEPER=spawn); nil when none is wanted.
	keeper func()

	// What voyager dev's start block tells.
	node       string
	gpus       []state.GPU
	simulated  bool
	containerd string // the socket in use
}

func (p *agentParts) component() component {
	return component{name: "agent", run: func(ctx context.Context) error {
		if p.keeper != nil {
			// A keeper that died is started again: a few seconds without
			// one is a few seconds in which only a live agent fences.
			go func() {
				for ctxwait.Sleep(ctx, 5*time.Second) {
					p.keeper()
				}
			}()
		}
		return p.agent.Run(ctx)
	}}
}

func (p *agentParts) close() {
	if p.nvml != nil {
		_ = p.nvml.Close()
	}
	if p.rt != nil {
		_ = p.rt.Close()
	}
	if p.daemon != nil {
		_ = p.daemon.Stop(10 * time.Second) // containers live on in their shims
	}
}

// claimSubnet is the container subnet of node's sessions on an isolated
// network: VOYAGER_AGENT_NETWORK_SUBNET, or the one its bridge carries, or
// a /24 derived from the agent's instance name, that no other node of the
// cluster claimed, claimed in etcd (nodeagent.ClaimSubnet; with sessions
// on a bridge whose subnet another node holds, that one, unclaimed). An etcd whose roles predate subnet claims
// refuses the claim: the agent then warns and uses the setting or the
// derived /24 unclaimed, as before claims. Empty on the host's network.
func claimSubnet(ctx context.Context, cli *clientv3.Client, cfg config.Config, node, instance string, log *slog.Logger) (string, error) {
	if cfg.AgentNetwork == runtime.NetworkHost {
		return cfg.AgentNetworkSubnet, nil
	}
	req := nodeagent.SubnetRequest{Node: node, Seed: instance, Explicit: cfg.AgentNetworkSubnet}
	if br, err := runtime.ReadBridge(runtime.NetworkOptions{Name: instance}); err != nil {
		log.Warn("read the network's bridge; choosing its subnet as for a new one", "err", err)
	} else {
		req.Current, req.Busy = br.Subnet, br.Ports > 0
	}
	s, err := nodeagent.ClaimSubnet(ctx, cli, state.MustKeys(cfg.EtcdPrefix), req, time.Now())
	if errors.Is(err, nodeagent.ErrSubnetKept) {
		log.Warn("container subnet kept unclaimed: multi-node jobs with the node that holds it are refused until this agent starts with no session here", "err", err)
		return s, nil
	}
	if errors.Is(err, rpctypes.ErrPermissionDenied) {
		log.Warn("etcd refused the agent's subnet claim: another node may take the same container subnet; run voyager etcd-roles setup to grant agents subnets/", "err", err)
		return cfg.AgentNetworkSubnet, nil
	}
	if err != nil {
		return "", err
	}
	log.Debug("container subnet claimed", "subnet", s)
	return s, nil
}

// devSimulatedGPUs is the inventory `voyager dev` makes up where NVML is absent.
const devSimulatedGPUs = "8xA100-80GB"

// newAgent builds the node agent from the configuration. dev is forgiving:
// no NVML means a simulated inventory, no containerd means a private one.
func newAgent(ctx context.Context, cli *clientv3.Client, cfg config.Config, log *slog.Logger, dev bool) (*agentParts, error) {
	node := cfg.AgentNode
	if node == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("find node name: %w; set %s", err, config.EnvAgentNode)
		}
		node = strings.ToLower(h)
		if i := strings.IndexByte(node, '.'); i > 0 {
			node = node[:i]
		}
		if err := state.ValidateName("node name", node); err != nil {
			return nil, fmt.Errorf("the host name cannot be a node name (%w); set %s", err, config.EnvAgentNode)
		}
	}
	address := cfg.AgentAddress
	if address == "" {
		address = node
		if dev {
			address = "127.0.0.1" // dev's URLs are for a browser on this machine
		}
	}
	gpus, simulated, err := inventory(node, cfg, log, dev)
	if err != nil {
		return nil, err
	}
	if gpus, err = shareGPUs(gpus, cfg, log); err != nil {
		return nil, err
	}
	first, last, _ := config.ParsePortRange(cfg.AgentPorts) // Load validated it
	if cfg.DataDir == "" {
		return nil, fmt.Errorf("find data directory: neither XDG_DATA_HOME nor HOME is set; set %s", config.EnvDataDir)
	}
	home := cfg.AgentHomeDir
	if home == "" {
		home = filepath.Join(cfg.DataDir, "homes")
	}
	instance := agentInstance(node, cfg)
	cdiDirs := cfg.AgentCDISpecDirs
	if simulated && cfg.AgentGPUMode == nodeagent.GPUModeCDI {
		dir, err := writeSimulatedCDISpec(instance, gpus)
		if err != nil {
			return nil, err
		}
		cdiDirs = append(append([]string(nil), cdiDirs...), dir)
	}
	var recheck func() []state.GPU
	if cfg.AgentGPUMode == nodeagent.GPUModeCDI && len(gpus) > 0 {
		// A GPU the CDI specs do not define would be bound to sessions that
		// then fail to start: offer it as unhealthy, saying why, instead,
		// and healthy again once a spec defines it (the agent checks again
		// every GPURecheckEvery).
		read := gpus
		check := func() ([]state.GPU, []string) {
			return nodeagent.CheckCDIDevices(read, nodeagent.DefaultCDIKind, cdiDirs, func(devices []string) ([]string, error) {
				return runtime.MissingCDIDevices(cdiDirs, devices)
			})
		}
		var problems []string
		gpus, problems = check()
		for _, p := range problems {
			log.Error("GPU offered as unhealthy: " + p)
		}
		recheck = func() []state.GPU { g, _ := check(); return g }
	}
	subnet, err := claimSubnet(ctx, cli, cfg, node, instance, log)
	if err != nil {
		return nil, err
	}
	parts := &agentParts{node: node, gpus: gpus, simulated: simulated}
	ropts := runtime.ContainerdOptions{
		Address: cfg.AgentContainerd, Namespace: cfg.AgentNamespace, CDISpecDirs: cdiDirs, Logger: log,
		Network: runtime.NetworkOptions{
			Mode: cfg.AgentNetwork, Name: instance, Subnet: subnet,
			PluginDirs: cfg.AgentCNIPluginDirs, DenyCIDRs: cfg.AgentNetworkDeny,
			BlockedPorts: [2]int{first, last}, Allow: allowEndpoints(cfg.AgentNetworkAllow),
		},
	}
	// Recorded so that a sweep can find this agent's containers after it
	// ended (internal/hostclean, make clean-host); advisory.
	_ = runtime.RecordOwner(runtime.Owner{Kind: "namespace", Name: cfg.AgentNamespace})
	if cfg.AgentNetwork == runtime.NetworkHost {
		log.Warn("sessions run on the machine's network: they reach etcd, the agent, the API and each other (" + config.EnvAgentNetwork + "=host is for debugging only)")
	}
	if cfg.AgentGPUMode == nodeagent.GPUModeEnv {
		ropts.RuntimeBinary = "nvidia-container-runtime"
	}
	rt, err := runtime.NewContainerd(ctx, ropts)
	if errors.Is(err, runtime.ErrNetworkSetup) {
		return nil, fmt.Errorf("%w (set %s=host to run sessions without isolation, for debugging only)", err, config.EnvAgentNetwork)
	}
	if err != nil && dev {
		dir := devContainerdDir(cfg)
		log.Debug("no containerd answers; starting a private one", "socket", cfg.AgentContainerd, "dir", dir, "err", err)
		d, derr := runtime.StartContainerd(ctx, dir)
		if derr != nil {
			return nil, fmt.Errorf("no containerd at %s (%s) and none could be started: %w", cfg.AgentContainerd, config.EnvAgentContainerd, derr)
		}
		parts.daemon = d
		ropts.Address = d.Address
		rt, err = runtime.NewContainerd(ctx, ropts)
	}
	if err != nil {
		parts.close()
		return nil, fmt.Errorf("%w (set %s)", err, config.EnvAgentContainerd)
	}
	parts.rt = rt
	parts.containerd = ropts.Address
	if dev {
		if err := ensureDevImage(ctx, rt, cfg.AgentImage, log); err != nil {
			log.Warn("no default session image: sessions that name none will fail", "image", cfg.AgentImage, "err", err)
		}
	}
	// Activity: real GPUs are sampled through NVML; simulated ones are
	// made as busy as their containers' CPUs, and marked simulated.
	var usage func() ([]nodeagent.GPUUsage, error)
	var sampler nodeagent.GPUSampler
	switch {
	case simulated:
		sampler = nodeagent.NewSimulatedSampler(rt)
	case len(gpus) > 0:
		usage = func() ([]nodeagent.GPUUsage, error) { return nodeagent.ReadNVMLUsage(nvml.New()) }
		nv := nodeagent.NewNVMLSampler(nvml.New())
		nv.WithProcesses(rt) // a fraction's GPU is sampled by its own processes
		parts.nvml, sampler = nv, nv
	}
	uid, gid := uint32(cfg.AgentUID), uint32(cfg.AgentGID)
	fenceAfter, fenceGrace := cfg.FenceTimings()
	parts.agent = nodeagent.New(nodeagent.Config{
		FenceAfter: fenceAfter, FenceGrace: fenceGrace, MPS: newMPS(gpus, simulated, cfg, log),
		Node: node, Address: address, Keys: state.MustKeys(cfg.EtcdPrefix), Client: cli, Runtime: rt,
		GPUs: gpus, RecheckGPUs: recheck, Simulated: simulated, CPUMilli: int64(goruntime.NumCPU()) * 1000, MemoryMiB: memTotalMiB(),
		Ports: state.PortRange{First: first, Last: last}, LeaseTTL: cfg.AgentLeaseTTL, Image: cfg.AgentImage,
		HomeDir: home, LogDir: filepath.Join(cfg.DataDir, "logs"), LogMaxBytes: int64(cfg.AgentLogMaxMiB) << 20,
		LogRetention: cfg.Retention,
		LogsBaseURL:  logsBaseURL(cfg.HTTPScheme(), address, cfg.HTTPAddr),
		StopGrace:    cfg.AgentStopGrace, StartTimeout: cfg.StartTimeout, UID: &uid, GID: &gid, GPUMode: cfg.AgentGPUMode,
		Version: version, Logger: log, Usage: usage,
		ActivityEvery: cfg.AgentActivityEvery, GPUSampler: sampler, GPUBusyPercent: cfg.AgentGPUBusyPercent,
		GPUUnusedAfter: cfg.AgentGPUUnusedAfter, RestartBackoff: cfg.RestartBackoff, RestartBackoffMax: cfg.RestartBackoffMax,
		JobRoutes: cfg.AgentJobRoutes, FenceDir: fenceDir(cfg),
		// dev's embedded etcd stops with it: no lease expires while it is
		// down, so a clean stop leaves the sessions for the next start.
		ParkOnShutdown: dev && len(cfg.EtcdEndpoints) == 0,
	})
	if cfg.AgentFenceKeeper != "off" {
		parts.keeper = startFenceKeeper(cfg, log)
	} else {
		startFenceKeeper(cfg, log) // says that none will
	}
	return parts, nil
}

// inventory reads the GPUs: made up when configured, else from NVML. Where
// NVML is absent the agent says so; dev then simulates, clearly marked.
func inventory(node string, cfg config.Config, log *slog.Logger, dev bool) ([]state.GPU, bool, error) {
	if cfg.AgentSimulateGPUs != "" {
		gpus, err := nodeagent.SimulatedGPUs(node, cfg.AgentSimulateGPUs)
		if err != nil {
			return nil, false, fmt.Errorf("%s: %w", config.EnvAgentSimulateGPUs, err)
		}
		log.Warn("GPU inventory is SIMULATED by configuration: these GPUs do not exist", "gpus", cfg.AgentSimulateGPUs, "env", config.EnvAgentSimulateGPUs)
		return gpus, true, nil
	}
	gpus, err := nodeagent.ReadNVML(nvml.New())
	switch {
	case errors.Is(err, nodeagent.ErrNoNVML) && dev:
		gpus, err := nodeagent.SimulatedGPUs(node, devSimulatedGPUs)
		// Expected on a machine without GPUs; dev's start block says so.
		log.Debug("NVML not found (no NVIDIA driver): voyager dev SIMULATES GPUs; the node is marked simulated", "gpus", devSimulatedGPUs)
		return gpus, true, err
	case errors.Is(err, nodeagent.ErrNoNVML):
		log.Warn("NVML not found (no NVIDIA driver on this machine): this node offers no GPUs; set " + config.EnvAgentSimulateGPUs + " to simulate some")
		return nil, false, nil
	case err != nil:
		return nil, false, err
	}
	log.Info("GPUs found", "count", len(gpus))
	return gpus, false, nil
}

// ensureDevImage makes the default image present, building it from
// Debian's busybox-static when it is the dev default and absent.
func ensureDevImage(ctx context.Context, rt *runtime.Containerd, image string, log *slog.Logger) error {
	ictx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err := rt.EnsureImage(ictx, image)
	if err == nil || !strings.HasPrefix(image, "voyager.local/busybox:") {
		return err
	}
	var buf bytes.Buffer
	if err := runtime.WriteBusyboxImage(&buf, "/bin/busybox", image); err != nil {
		return err
	}
	if _, err := rt.Import(ctx, &buf); err != nil {
		return err
	}
	log.Debug("imported a busybox image as the default session image", "image", image)
	return nil
}

// allowEndpoints reads VOYAGER_AGENT_NETWORK_ALLOW's ip:port list (Load
// validated it).
func allowEndpoints(list []string) []runtime.Endpoint {
	var out []runtime.Endpoint
	for _, a := range list {
		host, port, _ := net.SplitHostPort(a)
		n, _ := strconv.Atoi(port)
		out = append(out, runtime.Endpoint{Addr: host, Ports: []int{n}})
	}
	return out
}

// agentInstance names this agent among others on the machine: the
// configured network name, else a hash of node, containerd namespace and
// data directory. It names the session network and the simulated CDI
// spec's directory, so that agents on one machine (tests, several dev
// instances) never share either.
func agentInstance(node string, cfg config.Config) string {
	if cfg.AgentNetworkName != "" {
		return cfg.AgentNetworkName
	}
	sum := sha256.Sum256([]byte(node + "\x00" + cfg.AgentNamespace + "\x00" + cfg.DataDir))
	return "a" + hex.EncodeToString(sum[:6])
}

// writeSimulatedCDISpec writes a CDI spec for simulated GPUs, each
// /dev/null seen as /dev/nvidia<index> in the container, so that a session on
// a simulated GPU starts, with a device node that does nothing. It is
// runtime state of this agent instance, made again at every start: it goes
// to /run/voyager/cdi/<instance> (root), else to the temporary directory,
// and returns the directory. Another instance on the machine has its own.
func writeSimulatedCDISpec(instance string, gpus []state.GPU) (string, error) {
	dir := filepath.Join("/run/voyager/cdi", instance)
	if os.MkdirAll(dir, 0o755) != nil {
		dir = filepath.Join(os.TempDir(), "voyager-cdi-"+instance)
	}
	var b strings.Builder
	b.WriteString("# Written by voyager for SIMULATED GPUs: the device nodes are /dev/null.\n")
	b.WriteString("cdiVersion: \"0.6.0\"\nkind: nvidia.com/gpu\ndevices:\n")
	for _, g := range gpus {
		fmt.Fprintf(&b, "- name: %s\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia%d\n      hostPath: /dev/null\n", g.UUID, g.Index)
		for _, m := range g.MIGDevices {
			fmt.Fprintf(&b, "- name: %s\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia%d\n      hostPath: /dev/null\n", m.UUID, g.Index)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("write simulated CDI spec: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "voyager-simulated.yaml"), []byte(b.String()), 0o644); err != nil {
		return "", fmt.Errorf("write simulated CDI spec: %w", err)
	}
	// Recorded so that a sweep can remove the spec of an agent that ended
	// (internal/hostclean); advisory.
	_ = runtime.RecordOwner(runtime.Owner{Kind: "cdi", Name: instance, StateDir: dir})
	return dir, nil
}

// memTotalMiB reads the machine's memory from /proc/meminfo.
func memTotalMiB() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb / 1024
		}
	}
	return 0
}

// logsBaseURL is where the API reaches this agent's log endpoint: the
// node's address with the port of the agent's HTTP server.
func logsBaseURL(scheme, address, httpAddr string) string {
	_, port, err := net.SplitHostPort(httpAddr)
	if err != nil {
		return ""
	}
	return scheme + "://" + net.JoinHostPort(address, port)
}
