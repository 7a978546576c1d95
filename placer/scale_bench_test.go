package placer

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"math/rand"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/benchsum"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// The scale run's parameters; `make bench-scale` sets them.
var (
	scaleBin      = flag.String("scale.bin", "", "path of a built voyager binary: BenchmarkPlacementScale runs `voyager placer` from it (make bench-scale builds bin/voyager and passes it)")
	scaleNodes    = flag.Int("scale.nodes", 1000, "BenchmarkPlacementScale: lease-backed 8-GPU nodes the load generator registers")
	scaleSessions = flag.Int("scale.sessions", 20000, "BenchmarkPlacementScale: sessions of mixed sizes queued before the placer starts")
)

// BenchmarkPlacementScale is the large-site run (`make bench-scale`): a
// load generator registers scale.nodes simulated 8-GPU nodes under leases
// it keeps alive (one lease per 100 nodes) and queues scale.sessions
// sessions of mixed sizes on a real etcd with fsync; then one real
// `voyager placer` process starts. It reports the time from the process's
// start to its first binding (sync and first pass) and to a full cluster,
// bindings per second between the first and the last binding, the placer's
// CPU time per binding and its peak resident memory (VmHWM of the placer
// process alone). It needs a built binary (-scale.bin), so `make bench`
// passes over it.
func BenchmarkPlacementScale(b *testing.B) {
	if *scaleBin == "" {
		b.Skip("runs under make bench-scale, which builds bin/voyager and passes -scale.bin")
	}
	for i := 0; i < b.N; i++ {
		benchScale(b, *scaleBin, *scaleNodes, *scaleSessions)
	}
}

func benchScale(b *testing.B, bin string, nodes, sessions int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := etcdtest.Start(b, etcdtest.Options{Fsync: true})
	cli := c.Client(b)
	s := newSim(b, cli)

	// Load generator: nodes under leases it keeps alive, 100 to a lease
	// and to a transaction.
	genStart := time.Now()
	var lease clientv3.LeaseID
	var ops []clientv3.Op
	for i := 0; i < nodes; i++ {
		if i%100 == 0 {
			l, err := cli.Grant(ctx, 30)
			if err != nil {
				b.Fatal(err)
			}
			ka, err := cli.KeepAlive(ctx, l.ID)
			if err != nil {
				b.Fatal(err)
			}
			go func() {
				for range ka {
				}
			}()
			lease = l.ID
		}
		n := gpuNode(fmt.Sprintf("sim%05d", i), 8, "NVIDIA A100-SXM4-80GB (simulated)")
		n.Simulated = true
		n.Registered = time.Now().UTC()
		v, _ := state.Encode(n)
		ops = append(ops, clientv3.OpPut(s.k.Node(n.Name), v, clientv3.WithLease(lease)))
		if len(ops) == 100 || i == nodes-1 {
			if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
				b.Fatal(err)
			}
			ops = ops[:0]
		}
	}
	submitAll(b, ctx, s, benchSizes(rand.New(rand.NewSource(42)), sessions), 64, nil)
	b.Logf("load generator: %d nodes, %d sessions queued in %s", nodes, sessions, time.Since(genStart).Round(time.Millisecond))

	var mu sync.Mutex
	var first, last time.Time
	bound, gpus := 0, 0
	boundWatch(b, ctx, cli, s.k, func(bd state.Binding, _ int64) {
		mu.Lock()
		defer mu.Unlock()
		if bound == 0 {
			first = time.Now()
		}
		bound++
		gpus += len(bd.GPUs)
		last = time.Now()
	})

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	logf, err := os.Create(filepath.Join(b.TempDir(), "placer.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "placer")
	cmd.Env = append(os.Environ(), "HOME="+b.TempDir(), "VOYAGER_ETCD_ENDPOINTS="+c.Server.Endpoint(), "VOYAGER_HTTP_ADDR="+addr)
	cmd.Stdout, cmd.Stderr = logf, logf
	procStart := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-exited
	}()

	// Full: every GPU bound, or no binding for 3 s after the first. The
	// placer's metrics are read every 100 ms for its cache lag.
	deadline := time.Now().Add(30 * time.Minute)
	var maxLag, conflicts, txns float64
	metrics := &http.Client{Timeout: 5 * time.Second}
	for {
		if m, err := placerMetrics(metrics, "http://"+addr+"/metrics"); err == nil {
			maxLag = max(maxLag, m["voyager_placer_cache_lag_revisions"])
			conflicts, txns = m["voyager_placer_conflicts_total"], m["voyager_placer_bind_transactions_total"]
		}
		mu.Lock()
		full := gpus == nodes*8 || (bound > 0 && time.Since(last) > 3*time.Second)
		mu.Unlock()
		if full {
			break
		}
		select {
		case err := <-exited:
			b.Fatalf("voyager placer exited before the cluster filled: %v (log %s)", err, logf.Name())
		default:
		}
		if time.Now().After(deadline) {
			b.Fatalf("the cluster did not fill within 30 minutes (log %s)", logf.Name())
		}
		time.Sleep(100 * time.Millisecond)
	}
	hwm, cpu := procUsage(b, cmd.Process.Pid)
	st, err := cli.Status(ctx, c.Server.Endpoint())
	if err != nil {
		b.Fatal(err)
	}
	dbMiB := float64(st.DbSize) / (1 << 20)
	mu.Lock()
	n, g, toFirst, toFull, span := bound, gpus, first.Sub(procStart), last.Sub(procStart), last.Sub(first)
	mu.Unlock()
	rate := float64(n) / span.Seconds()
	b.ReportMetric(toFirst.Seconds(), "s-to-first-binding")
	b.ReportMetric(toFull.Seconds(), "s-to-full")
	b.ReportMetric(rate, "bindings/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(max(n, 1)), "placer-cpu-us/binding")
	b.ReportMetric(float64(hwm)/1024, "placer-peak-rss-MiB")
	b.ReportMetric(maxLag, "max-cache-lag-revs")
	b.ReportMetric(conflicts, "conflicts")
	b.ReportMetric(dbMiB, "etcd-db-MiB")
	label := fmt.Sprintf("scale %d nodes x 8 GPUs, %d queued", nodes, sessions)
	benchsum.Add(b, benchsum.Row{Figure: label + ": bindings/s", Value: rate, Unit: "bindings/s"})
	benchsum.Add(b, benchsum.Row{Figure: label + ": time to full (from placer start)", Value: toFull.Seconds(), Unit: "s"})
	benchsum.Add(b, benchsum.Row{Figure: label + ": placer peak RSS", Value: float64(hwm) / 1024, Unit: "MiB"})
	benchsum.Add(b, benchsum.Row{Figure: label + ": placer CPU per binding", Value: float64(cpu.Microseconds()) / float64(max(n, 1)), Unit: "µs"})
	benchsum.Add(b, benchsum.Row{Figure: label + ": placer cache lag at most", Value: maxLag, Unit: "revisions"})
	benchsum.Add(b, benchsum.Row{Figure: label + ": etcd db size", Value: dbMiB, Unit: "MiB"})
	b.Logf("%s: voyager placer's first binding %s after start, full (%d sessions, %d of %d GPUs) %s after start; %.0f bindings/s; placer CPU %s (%.0f µs/binding), peak RSS %.0f MiB; %.0f bind txns, %.0f conflicts; cache lag at most %.0f revisions; etcd db %.0f MiB",
		label, toFirst.Round(time.Millisecond), n, g, nodes*8, toFull.Round(time.Millisecond), rate, cpu.Round(time.Millisecond),
		float64(cpu.Microseconds())/float64(max(n, 1)), float64(hwm)/1024, txns, conflicts, maxLag, dbMiB)
}

// procUsage reads a live process's peak resident memory (VmHWM, KiB) and
// its CPU time (user and system) from /proc.
func procUsage(b *testing.B, pid int) (hwmKiB int64, cpu time.Duration) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			hwmKiB, _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name, which is in parentheses: utime and
	// stime are the 12th and 13th, in clock ticks (100 a second on Linux).
	rest := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	utime, _ := strconv.ParseInt(rest[11], 10, 64)
	stime, _ := strconv.ParseInt(rest[12], 10, 64)
	return hwmKiB, time.Duration(utime+stime) * 10 * time.Millisecond
}

// placerMetrics reads the unlabelled sums of a Prometheus text page: each
// metric's samples added up across labels.
func placerMetrics(client *http.Client, url string) (map[string]float64, error) {
	resp, err := client.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(f[0], "{")
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			out[name] += v
		}
	}
	return out, sc.Err()
}
