package history_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// Agents as processes of their own, so that the soak can pause them for
// real (SIGSTOP, SIGCONT), as a machine's agent is paused by a debugger,
// a stalled VM or a swap storm: the test binary started again with the
// environment below runs one node agent (TestMain, soakAgentMain) on an
// in-memory runtime of its own. Its containers live in that process, so
// a kill -9 takes them along (containerd's outlive their agent: the
// in-process agents keep that case); the agent that comes back finds its
// launched attempts' containers gone and ends them Fenced.

const (
	envSoakAgentNode = "VOYAGER_SOAK_AGENT_NODE"
	envSoakAgentEtcd = "VOYAGER_SOAK_AGENT_ENDPOINTS"
	envSoakAgentMIG  = "VOYAGER_SOAK_AGENT_MIG"
	envSoakAgentDir  = "VOYAGER_SOAK_AGENT_DIR"
	envSoakAgentGC   = "VOYAGER_SOAK_AGENT_GOGC"
	// envSoakEtcdMember makes the test binary an etcd member (-soak.etcd=module).
	envSoakEtcdMember = "VOYAGER_SOAK_ETCD_MEMBER"
)

// soakAgentConfig is the configuration of the soak's agent of node i
// (name) over cli and rt: one for the in-process agents and the agent
// processes alike.
func soakAgentConfig(i int, name string, mig bool, cli *clientv3.Client, rt runtime.Runtime, dir string) nodeagent.Config {
	gpus, _ := nodeagent.SimulatedGPUs(name, "8xA100-80GB")
	if mig {
		g := &gpus[0]
		g.MIGEnabled = true
		g.MIGDevices = []state.MIGDevice{{UUID: "MIG-" + name + "-0a", Profile: "3g.40gb", MemoryMiB: 40192},
			{UUID: "MIG-" + name + "-0b", Profile: "3g.40gb", MemoryMiB: 40192}}
	}
	return nodeagent.Config{Node: name, Address: "127.0.0.1", Keys: state.MustKeys("/soak"), Client: cli, Runtime: rt,
		GPUs: gpus, Simulated: true, CPUMilli: 16000, MemoryMiB: 65536,
		Ports: state.PortRange{First: 41000 + 100*i, Last: 41099 + 100*i}, LeaseTTL: soakAgentTTL,
		Image: "busybox", HomeDir: dir + "/home", LogDir: dir + "/logs", StopGrace: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Resync: time.Second, RestartBackoff: 10 * time.Millisecond,
		RestartBackoffMax: 50 * time.Millisecond, ActivityEvery: time.Hour, RunReportAfter: soakReportAfter(i), StopReportAfter: soakReportAfter(i)}
}

// soakReportAfter is node i's Config.RunReportAfter and StopReportAfter:
// the soak's containers end at once or run until stopped, so with the
// agents' defaults (a second) their parts would seldom say Running or
// Stopping, and the checker would seldom see those phases; every sixth
// node reports them at once (every third cost about a sixth of a
// revision a bind more for the same transactions seen as often again).
func soakReportAfter(i int) time.Duration {
	if i%6 == 0 {
		return -1
	}
	return 0
}

// soakRuntime is the soak's in-memory runtime: a container exits with
// its SOAK_EXIT code at once, or runs until stopped.
func soakRuntime() *runtime.Fake {
	f := runtime.NewFake(nil, "busybox")
	f.Exit = func(s runtime.Spec) (int, bool) {
		if v, ok := s.Env["SOAK_EXIT"]; ok {
			code, _ := strconv.Atoi(v)
			return code, true
		}
		return 0, false // runs until stopped
	}
	return f
}

// TestMain runs the package's tests, or, in a process the soak started,
// one soak agent (envSoakAgentNode) or one etcd member (envSoakEtcdMember:
// etcd's own main, at go.mod's version, with the flags it was given) until
// SIGTERM or SIGKILL.
func TestMain(m *testing.M) {
	if os.Getenv(envSoakAgentNode) != "" {
		os.Exit(soakAgentMain())
	}
	if os.Getenv(envSoakEtcdMember) != "" {
		etcdmain.Main(append([]string{"etcd"}, os.Args[1:]...))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// soakAgentMain is the body of a soak agent process.
func soakAgentMain() int {
	name := os.Getenv(envSoakAgentNode)
	i, err := strconv.Atoi(strings.TrimPrefix(name, "n"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "soak agent: node %q: %v\n", name, err)
		return 2
	}
	if gc, err := strconv.Atoi(os.Getenv(envSoakAgentGC)); err == nil && gc > 0 {
		debug.SetGCPercent(gc)
	}
	// The node's etcd outages: SIGUSR1 cuts its link, SIGUSR2 restores it.
	link := etcdtest.NewLink()
	cuts := make(chan os.Signal, 4)
	signal.Notify(cuts, syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		for sig := range cuts {
			if sig == syscall.SIGUSR1 {
				link.Cut()
			} else {
				link.Restore()
			}
		}
	}()
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(os.Getenv(envSoakAgentEtcd), ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{link.DialOption()}})
	if err != nil {
		fmt.Fprintf(os.Stderr, "soak agent %s: %v\n", name, err)
		return 1
	}
	defer cli.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	cfg := soakAgentConfig(i, name, os.Getenv(envSoakAgentMIG) == "1", cli, soakRuntime(), os.Getenv(envSoakAgentDir))
	if err := nodeagent.New(cfg).Run(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "soak agent %s: %v\n", name, err)
		return 1
	}
	return 0
}

// agentProcess is a running soak agent process.
type agentProcess struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// agentProcs starts, pauses and kills the soak's agent processes, and
// counts the CPU of those that ended.
type agentProcs struct {
	tb    testing.TB
	ended atomic.Int64 // nanoseconds of CPU of the processes that ended
	mu    sync.Mutex
	live  map[*agentProcess]bool
}

// start runs node i's agent process (name) against endpoints, through a
// link of its own that cut and restore cut.
func (ap *agentProcs) start(i int, name string, mig bool, endpoints []string, dir string, gogc int) (*agentProcess, error) {
	cmd := exec.Command(os.Args[0])
	migv := "0"
	if mig {
		migv = "1"
	}
	cmd.Env = append(os.Environ(), envSoakAgentNode+"="+name, envSoakAgentEtcd+"="+strings.Join(endpoints, ","),
		envSoakAgentMIG+"="+migv, envSoakAgentDir+"="+dir, envSoakAgentGC+"="+strconv.Itoa(gogc))
	// Die with the soak: a soak killed by its timeout runs no cleanup.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start agent process %s: %w", name, err)
	}
	p := &agentProcess{cmd: cmd, done: make(chan struct{})}
	ap.mu.Lock()
	if ap.live == nil {
		ap.live = map[*agentProcess]bool{}
	}
	ap.live[p] = true
	ap.mu.Unlock()
	go func() {
		defer close(p.done)
		_ = cmd.Wait()
		if st := cmd.ProcessState; st != nil {
			ap.ended.Add(int64(st.UserTime() + st.SystemTime()))
		}
		ap.mu.Lock()
		delete(ap.live, p)
		ap.mu.Unlock()
	}()
	return p, nil
}

// kill kills p (SIGKILL, after a SIGCONT should it be paused) and waits.
func (p *agentProcess) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// pause stops p (SIGSTOP) for d, then lets it go on (SIGCONT).
func (p *agentProcess) pause(d time.Duration) {
	if p.cmd.Process.Signal(syscall.SIGSTOP) != nil {
		return
	}
	time.Sleep(d)
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
}

// cut cuts p's etcd link (SIGUSR1): an etcd outage of its node.
func (p *agentProcess) cut() { _ = p.cmd.Process.Signal(syscall.SIGUSR1) }

// restore restores p's etcd link (SIGUSR2).
func (p *agentProcess) restore() { _ = p.cmd.Process.Signal(syscall.SIGUSR2) }

// cpu is the CPU the agent processes have used: the ended ones' and the
// live ones' so far.
func (ap *agentProcs) cpu() time.Duration {
	sum := time.Duration(ap.ended.Load())
	ap.mu.Lock()
	defer ap.mu.Unlock()
	for p := range ap.live {
		if d, err := etcdtest.ProcessCPU(p.cmd.Process.Pid); err == nil {
			sum += d
		}
	}
	return sum
}
