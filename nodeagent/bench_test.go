package nodeagent_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	containerd "github.com/containerd/containerd"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/benchsum"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/internal/scalebench"
	"github.com/voyager-gpu/voyager/merger"
	"github.com/voyager-gpu/voyager/nodeagent"
	vrt "github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
	"github.com/voyager-gpu/voyager/state"
)

// agentBenchRounds is how many rounds of agentBenchBatch sessions the
// benchmark runs per image, through the agent and directly each.
var agentBenchRounds = flag.Int("agentbench.rounds", 25, "BenchmarkAgentBindToRunning: rounds of 8 sessions per image and path (25: 200 samples each)")

// agentBenchBatch is how many sessions one round binds at once: one per
// simulated GPU of the node, each with its own GPU.
const agentBenchBatch = 8

// jupyterImageRef is the image make image builds from Debian's packages.
const jupyterImageRef = "voyager.local/jupyter:latest"

// EnvBenchBinary names a built voyager binary for the benchmark to run
// (make bench passes bin/voyager); unset, the benchmark builds one.
const EnvBenchBinary = "VOYAGER_BENCH_BINARY"

// BenchmarkAgentBindToRunning measures bind→Running on one node whose
// agent is a real `voyager agent` process (bin/voyager) on real
// containerd, against Debian's etcd in its own process with fsync on (its
// data directory on disk). The node has 8 simulated GPUs; every session
// binds one, injected through the CDI spec the agent writes (stand-in
// device nodes: /dev/null as /dev/nvidia<i>), in its own network
// namespace (the default, isolated networking). Two images, each its own
// figures: the busybox stand-in (busybox httpd answering as Jupyter) and
// real Jupyter Server from the Debian image that make image builds
// (voyager.local/jupyter:latest; its archive from
// deploy/images/jupyter/build.sh — absent, its figures are reported as
// skipped, loudly).
//
// A round binds 8 sessions in one transaction (the way a placer fills an
// 8-GPU node) and times each from the bind's commit to its Running status (the
// container started, its port answering HTTP, the part reported and the
// status merger's status written, seen on a watch), then stops them and
// waits for their containers to go. The ceiling is measured in the same
// run, round for round (alternating which goes first): the same 8
// containers — the agent's own ContainerSpec, image, command, CDI GPUs,
// limits, published port and isolated network — started directly through
// the runtime (runtime.Containerd, which the agent uses), no etcd, no
// agent, no merger, timed from the start call until the port answers
// HTTP (probed every 10 ms; the agent probes every 100 ms). Each path
// gets agentbench.rounds × 8 samples per image (200 by default);
// percentiles are nearest-rank over them.
//
// Metrics per image (busybox-, jupyter-): p50-ms, p99-ms through the
// agent, direct-p50-ms, direct-p99-ms started directly, x-direct-p50 and
// x-direct-p99 their ratios. agent-rss-MiB is the agent process's VmRSS
// with 8 sessions of that image running; agent-hwm-MiB its peak (VmHWM)
// over the whole run; agent-cpu-ms its CPU time (user+system) per session
// from bind to the container's removal. hop-p50-ms and hop-p99-ms are the
// status merger's part of bind→Running: from the agent's Running part to
// the Running status, both seen on one watch in revision order.
func BenchmarkAgentBindToRunning(b *testing.B) {
	bin := benchBinary(b)
	etcd := etcdtest.StartExternalWith(b, etcdtest.ExternalOptions{Fsync: true})
	cli := etcd.Client(b)

	// One containerd namespace for the agent and the direct starts, so the
	// images are unpacked once; the agent only touches containers labelled
	// with its node, the direct ones carry another node's label.
	ns := fmt.Sprintf("ab-%d-%d", os.Getpid(), benchSeq.Add(1))
	rt := runtimetest.New(b, vrt.ContainerdOptions{Namespace: ns})
	images := []benchImage{{name: "busybox stand-in", short: "busybox", ref: runtimetest.ImageRef}}
	jupyterFigure := "Jupyter (Debian image)"
	if archive, ok := jupyterArchive(); ok {
		importArchive(b, rt, archive)
		images = append(images, benchImage{name: jupyterFigure, short: "jupyter", ref: jupyterImageRef})
	} else {
		for _, q := range []string{"p50", "p99"} {
			benchsum.Skip(b, benchFigure(jupyterFigure, q), "no image archive at "+archive+": run make image (deploy/images/jupyter/build.sh, about 2 minutes)")
		}
	}

	agentNet := fmt.Sprintf("ab%d-%d", os.Getpid(), benchSeq.Add(1))
	agent := startAgentProcess(b, bin, etcd.Endpoint, runtimetest.Address(b), ns, agentNet)
	n := waitNode(b, cli)
	runMerger(b, cli)
	cdiDir := filepath.Join("/run/voyager/cdi", agentNet) // where the agent wrote its simulated GPUs' spec
	if _, err := os.Stat(filepath.Join(cdiDir, "voyager-simulated.yaml")); err != nil {
		b.Fatalf("the agent's CDI spec for its simulated GPUs: %v", err)
	}

	// The direct path: its own runtime over the same namespace, with the
	// agent's CDI spec and an isolated network of its own, and an agent
	// (never run) to build the very spec the agent would.
	directNet := fmt.Sprintf("ab%d-%d", os.Getpid(), benchSeq.Add(1))
	direct := runtimetest.New(b, vrt.ContainerdOptions{Namespace: ns, CDISpecDirs: []string{cdiDir}, Logger: slog.New(slog.DiscardHandler),
		Network: vrt.NetworkOptions{Mode: vrt.NetworkIsolated, Name: directNet, StateDir: b.TempDir()}})
	uid, gid := uint32(1000), uint32(100) // voyager agent's defaults
	dir := b.TempDir()
	builder := nodeagent.New(nodeagent.Config{Node: "ab-direct", Address: "127.0.0.1", Keys: keys, Client: cli, Runtime: direct,
		GPUs: n.GPUs, Simulated: true, HomeDir: dir + "/home", LogDir: dir + "/logs", UID: &uid, GID: &gid,
		Logger: slog.New(slog.DiscardHandler)})

	agentPorts := n.Ports.First
	directPorts := make([]int, agentBenchBatch)
	for i := range directPorts {
		directPorts[i] = freePort(b)
	}
	var hops []time.Duration
	seq := 0
	for _, img := range images {
		var viaAgent, viaRuntime []time.Duration
		var agentCPU time.Duration
		for r := 0; r < *agentBenchRounds; r++ {
			throughAgent := func() {
				before := cpu(b, agent)
				lat, h := agentRound(b, cli, rt, img.ref, seq, agentPorts, n.GPUs, r == 0)
				seq++
				viaAgent, hops = append(viaAgent, lat...), append(hops, h...)
				if r == 0 {
					b.ReportMetric(float64(agent.RSS(b))/1024, img.short+"-agent-rss-MiB")
				}
				stopAgentRound(b, cli, rt, seq-1)
				agentCPU += cpu(b, agent) - before
			}
			first, second := throughAgent, func() {
				viaRuntime = append(viaRuntime, directRound(b, builder, direct, img.ref, fmt.Sprintf("d%d", seq), directPorts, n.GPUs, r == 0)...)
				seq++
			}
			if r%2 == 1 {
				first, second = second, first
			}
			first()
			second()
		}
		for _, q := range []float64{0.50, 0.99} {
			name := fmt.Sprintf("p%.0f", q*100)
			b.ReportMetric(benchsum.QuantileMS(viaAgent, q), img.short+"-"+name+"-ms")
			b.ReportMetric(benchsum.QuantileMS(viaRuntime, q), img.short+"-direct-"+name+"-ms")
			b.ReportMetric(benchsum.QuantileMS(viaAgent, q)/benchsum.QuantileMS(viaRuntime, q), img.short+"-x-direct-"+name)
			benchsum.Add(b, benchsum.Row{Figure: benchFigure(img.name, name), Value: benchsum.QuantileMS(viaAgent, q), Unit: "ms",
				Ceiling: benchsum.QuantileMS(viaRuntime, q), CeilingName: fmt.Sprintf("the same containers started directly through containerd, same run (%d samples each)", len(viaRuntime))})
		}
		cpuMs := float64(agentCPU.Milliseconds()) / float64(len(viaAgent))
		b.ReportMetric(cpuMs, img.short+"-agent-cpu-ms")
		benchsum.Add(b, benchsum.Row{Figure: "agent CPU per session, bind to removal, " + img.name, Value: cpuMs, Unit: "ms"})
	}
	hwmKiB, _ := agent.Usage(b)
	hwm := float64(hwmKiB) / 1024
	b.ReportMetric(hwm, "agent-hwm-MiB")
	benchsum.Add(b, benchsum.Row{Figure: "agent peak resident memory (VmHWM of the voyager agent process), 8 sessions at a time", Value: hwm, Unit: "MiB"})
	b.ReportMetric(benchsum.QuantileMS(hops, 0.50), "hop-p50-ms")
	b.ReportMetric(benchsum.QuantileMS(hops, 0.99), "hop-p99-ms")
}

// benchFigure names a bind→Running figure of the summary table.
func benchFigure(image, quantile string) string {
	return fmt.Sprintf("agent bind->Running %s, %s, 8 at once with CDI GPUs, etcd fsync (%d samples)", quantile, image, *agentBenchRounds*agentBenchBatch)
}

// benchImage is one image the benchmark runs sessions of.
type benchImage struct{ name, short, ref string }

// benchSeq numbers names within the benchmark binary.
var benchSeq atomic.Int64

// benchBinary is $VOYAGER_BENCH_BINARY, else a voyager built for tb.
func benchBinary(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv(EnvBenchBinary); p != "" {
		return p
	}
	out := filepath.Join(tb.TempDir(), "voyager")
	cmd := exec.Command("go", "build", "-o", out, "-ldflags", "-extldflags=-Wl,-z,lazy", "github.com/voyager-gpu/voyager/cmd/voyager")
	if msg, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("build voyager: %v\n%s", err, msg)
	}
	return out
}

// jupyterArchive is where make image keeps the Jupyter image's archive
// (VOYAGER_IMAGE_CACHE, else ~/.cache/voyager/images), and whether it is
// there.
func jupyterArchive() (string, bool) {
	cache := os.Getenv("VOYAGER_IMAGE_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "voyager", "images")
	}
	path := filepath.Join(cache, "voyager.local-jupyterlab.tar")
	_, err := os.Stat(path)
	return path, err == nil
}

// importArchive imports an image archive into rt.
func importArchive(tb testing.TB, rt *vrt.Containerd, path string) {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	start := time.Now()
	if _, err := rt.Import(context.Background(), f); err != nil {
		tb.Fatalf("import %s: %v", path, err)
	}
	tb.Logf("imported %s in %v", path, time.Since(start).Round(time.Second))
}

// startAgentProcess runs `voyager agent` (scalebench.Start) for node on
// containerd at addr, namespace ns, with 8 simulated GPUs injected through
// CDI and sessions each in an isolated network named network; it is
// stopped (SIGTERM) and its network removed when tb ends.
func startAgentProcess(tb testing.TB, bin, endpoint, addr, ns, network string) *scalebench.Proc {
	tb.Helper()
	// Registered first, so it runs after the process stopped.
	tb.Cleanup(func() {
		_ = vrt.RemoveNetwork(context.Background(), vrt.NetworkOptions{Mode: vrt.NetworkIsolated, Name: network}, slog.New(slog.DiscardHandler))
		_ = os.RemoveAll(filepath.Join("/run/voyager/cdi", network))
		_ = os.RemoveAll(filepath.Join("/run/voyager/net", network)) // its state directory, empty by now
	})
	p := scalebench.Start(tb, bin, "agent", endpoint, "VOYAGER_ETCD_PREFIX=/voyager",
		"VOYAGER_AGENT_NODE="+node, "VOYAGER_AGENT_ADDRESS=127.0.0.1",
		"VOYAGER_AGENT_CONTAINERD="+addr, "VOYAGER_AGENT_NAMESPACE="+ns,
		"VOYAGER_AGENT_SIMULATE_GPUS=8xA100-80GB", "VOYAGER_AGENT_GPU_MODE=cdi",
		"VOYAGER_AGENT_NETWORK=isolated", "VOYAGER_AGENT_NETWORK_NAME="+network,
		"VOYAGER_AGENT_PORTS="+runtimetest.FreePortRange(tb, agentBenchBatch),
		"VOYAGER_AGENT_STOP_GRACE=2s", "VOYAGER_LOG_LEVEL=warn")
	tb.Cleanup(func() {
		if tb.Failed() {
			out, _ := os.ReadFile(p.Log)
			tb.Logf("voyager agent's log:\n%s", out)
		}
	})
	return p
}

// cpu is p's CPU time so far, user and system.
func cpu(tb testing.TB, p *scalebench.Proc) time.Duration {
	tb.Helper()
	_, t := p.Usage(tb)
	return t
}

// runMerger runs a status merger, as a placer process does, until tb
// ends: the agent reports parts, the merger writes the statuses.
func runMerger(tb testing.TB, cli *clientv3.Client) {
	m := merger.New(cli, merger.Config{Keys: keys, Logger: quietLogger()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("merger Run: %v", err)
		}
	})
}

// waitNode waits for the agent's node record and returns it.
func waitNode(tb testing.TB, cli *clientv3.Client) state.Node {
	tb.Helper()
	var n state.Node
	waitFor(tb, "the agent's node record", time.Minute, func() (bool, string) {
		var err error
		n, _, err = state.Get[state.Node](context.Background(), cli, keys.Node(node))
		return err == nil && len(n.GPUs) == agentBenchBatch, fmt.Sprint(err)
	})
	return n
}

// agentRound binds 8 notebook sessions of image to the agent's node, each
// with one GPU and a port from first on, and returns each one's time from
// its bind's commit to its Running status, and the status merger's hop
// (the Running part to the Running status). check asserts that the
// containers got their GPUs through CDI.
func agentRound(tb testing.TB, cli *clientv3.Client, rt *vrt.Containerd, image string, round, first int, gpus []state.GPU, check bool) (lat, hops []time.Duration) {
	tb.Helper()
	ctx := context.Background()
	resp, err := cli.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		tb.Fatal(err)
	}
	// One watch over parts and statuses: their events come in revision
	// order, so a part's Running precedes its status's.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := cli.Watch(wctx, keys.All(), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	partRunning := map[string]time.Time{}
	bound := map[string]time.Time{}
	var ss []state.Session
	var bs []state.Binding
	for i := range agentBenchBatch {
		ss = append(ss, state.Session{ID: fmt.Sprintf("ab%d-%d", round, i), Owner: "ada", Kind: state.KindNotebook, Image: image})
		bs = append(bs, state.Binding{CPUMilli: 1000, MemoryMiB: 1024, GPUs: []string{gpus[i].UUID}, Ports: []int{first + i}})
	}
	bindAll(tb, cli, ss, bs) // one transaction, as a placer binds a batch: all 8 start at once, as the direct ones do
	at := time.Now()
	for _, s := range ss {
		bound[s.ID] = at
	}
	running := map[string]bool{}
	deadline := time.After(3 * time.Minute)
	for len(running) < agentBenchBatch {
		select {
		case wr := <-wch:
			for _, ev := range wr.Events {
				key := string(ev.Kv.Key)
				if _, id, ok := keys.PartKey(key); ok && ev.Type == clientv3.EventTypePut {
					if p, err := state.Decode[state.PartStatus](ev.Kv.Value); err == nil && p.Phase == state.PhaseRunning && partRunning[id].IsZero() {
						partRunning[id] = time.Now()
					}
					continue
				}
				if !strings.HasPrefix(key, keys.StatusDir()) {
					continue
				}
				st, err := state.Decode[state.Status](ev.Kv.Value)
				if err != nil || running[st.Session] || bound[st.Session].IsZero() {
					continue
				}
				switch st.Phase {
				case state.PhaseRunning:
					running[st.Session] = true
					lat = append(lat, time.Since(bound[st.Session]))
					if at := partRunning[st.Session]; !at.IsZero() {
						hops = append(hops, time.Since(at))
					}
				case state.PhaseFailed:
					tb.Fatalf("%s failed: %s", st.Session, st.Message)
				}
			}
		case <-deadline:
			tb.Fatalf("%d of %d sessions Running after 3 minutes", len(running), agentBenchBatch)
		}
	}
	if check {
		checkCDIDevices(tb, rt, map[string]string{nodeagent.LabelNode: node})
	}
	return lat, hops
}

// stopAgentRound stops the sessions of round and waits until the agent
// removed their containers (after releasing their bindings).
func stopAgentRound(tb testing.TB, cli *clientv3.Client, rt *vrt.Containerd, round int) {
	tb.Helper()
	ctx := context.Background()
	for i := range agentBenchBatch {
		id := fmt.Sprintf("ab%d-%d", round, i)
		s, _, err := state.Get[state.Session](ctx, cli, keys.Session(id))
		if err != nil {
			tb.Fatal(err)
		}
		s.Desired = state.DesiredStopped
		if _, err := state.Put(ctx, cli, keys.Session(id), s); err != nil {
			tb.Fatal(err)
		}
	}
	waitFor(tb, "the round's containers removed", 5*time.Minute, func() (bool, string) {
		infos, err := rt.List(ctx, map[string]string{nodeagent.LabelNode: node})
		return err == nil && len(infos) == 0, fmt.Sprint(len(infos), err)
	})
}

// directRound starts 8 containers at once, as the agent would for 8
// notebook sessions of image (builder's ContainerSpec, command, CDI GPUs,
// published ports), directly through rt, and returns each one's time from
// the start call until its port answers HTTP; then removes them. check
// asserts that they got their GPUs through CDI.
func directRound(tb testing.TB, builder *nodeagent.Agent, rt *vrt.Containerd, image, prefix string, ports []int, gpus []state.GPU, check bool) []time.Duration {
	tb.Helper()
	ctx := context.Background()
	lat := make([]time.Duration, agentBenchBatch)
	errs := make([]error, agentBenchBatch)
	ids := make([]string, agentBenchBatch)
	var wg sync.WaitGroup
	for i := range agentBenchBatch {
		s := state.Session{ID: fmt.Sprintf("%s-%d", prefix, i), Owner: "ada", Kind: state.KindNotebook, Image: image}
		bd := state.Binding{Session: s.ID, Node: "ab-direct", Role: state.RoleSingle, QueueRevision: 1,
			CPUMilli: 1000, MemoryMiB: 1024, GPUs: []string{gpus[i].UUID}, Ports: []int{ports[i]}}
		args, err := nodeagent.Command(s, bd, nodeagent.Head{})
		if err != nil {
			tb.Fatal(err)
		}
		spec, err := builder.ContainerSpec(s, bd, args, randomToken(tb))
		if err != nil {
			tb.Fatal(err)
		}
		p, err := nodeagent.SplitPorts(s.Kind, bd.Role, bd.Ports)
		if err != nil {
			tb.Fatal(err)
		}
		spec.Publish, spec.Reach = nodeagent.NetworkRules(p, nil)
		ids[i] = spec.ID
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			if err := rt.Start(ctx, spec); err != nil {
				errs[i] = err
				return
			}
			errs[i] = awaitHTTP(ctx, p.Jupyter, 5*time.Minute)
			lat[i] = time.Since(start)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			tb.Fatalf("start directly: %v", err)
		}
	}
	if check {
		checkCDIDevices(tb, rt, map[string]string{nodeagent.LabelNode: "ab-direct"})
	}
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = rt.Stop(ctx, id, 2*time.Second)
			if err := rt.Remove(ctx, id); err != nil {
				tb.Errorf("remove %s: %v", id, err)
			}
		}()
	}
	wg.Wait()
	return lat
}

// awaitHTTP probes 127.0.0.1:port every 10 ms until it answers HTTP.
func awaitHTTP(ctx context.Context, port int, within time.Duration) error {
	client := &http.Client{Timeout: time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	url := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) + "/"
	deadline := time.After(within)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			return nil
		}
		select {
		case <-deadline:
			return fmt.Errorf("port %d did not answer HTTP within %v", port, within)
		case <-tick.C:
		}
	}
}

// randomToken is a Jupyter token for a container started directly.
func randomToken(tb testing.TB) string {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// checkCDIDevices asserts that every container of rt with labels has its
// GPU as a device node /dev/nvidia<i> in its OCI spec: injected from the
// CDI spec, not merely named.
func checkCDIDevices(tb testing.TB, rt *vrt.Containerd, labels map[string]string) {
	tb.Helper()
	ctx := context.Background()
	cli, err := containerd.New(rt.Address(), containerd.WithDefaultNamespace(rt.Namespace()))
	if err != nil {
		tb.Fatal(err)
	}
	defer cli.Close()
	infos, err := rt.List(ctx, labels)
	if err != nil || len(infos) != agentBenchBatch {
		tb.Fatalf("%d containers labelled %v (%v), want %d", len(infos), labels, err, agentBenchBatch)
	}
	for _, in := range infos {
		c, err := cli.LoadContainer(ctx, in.ID)
		if err != nil {
			tb.Fatal(err)
		}
		spec, err := c.Spec(ctx)
		if err != nil {
			tb.Fatal(err)
		}
		found := false
		if spec.Linux != nil {
			for _, d := range spec.Linux.Devices {
				found = found || strings.HasPrefix(d.Path, "/dev/nvidia")
			}
		}
		if !found {
			tb.Fatalf("container %s has no /dev/nvidia* device: its GPU was not injected through CDI", in.ID)
		}
	}
}
