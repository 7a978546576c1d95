package scalebench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
)

// RegisterNodes puts node(i) for i in [0, n) under nodes/, 100 to a lease
// and to a transaction, and keeps the leases alive until ctx ends, as n
// agents would. It fails tb on any error.
func RegisterNodes(tb testing.TB, ctx context.Context, cli *clientv3.Client, k state.Keys, n int, node func(i int) state.Node) {
	tb.Helper()
	var lease clientv3.LeaseID
	var ops []clientv3.Op
	for i := 0; i < n; i++ {
		if i%100 == 0 {
			l, err := cli.Grant(ctx, 30)
			if err != nil {
				tb.Fatalf("grant node lease: %v", err)
			}
			ka, err := cli.KeepAlive(ctx, l.ID)
			if err != nil {
				tb.Fatalf("keep node lease alive: %v", err)
			}
			go func() {
				for range ka {
				}
			}()
			lease = l.ID
		}
		nd := node(i)
		v, err := state.Encode(nd)
		if err != nil {
			tb.Fatalf("encode node: %v", err)
		}
		ops = append(ops, clientv3.OpPut(k.Node(nd.Name), v, clientv3.WithLease(lease)))
		if len(ops) == 100 || i == n-1 {
			if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
				tb.Fatalf("register nodes: %v", err)
			}
			ops = ops[:0]
		}
	}
}

// Proc is a voyager subcommand running as its own process, its HTTP
// listener (/readyz, /metrics and, for the API, the API) on Addr.
type Proc struct {
	// Addr is the process's VOYAGER_HTTP_ADDR, a free loopback port.
	Addr string
	// Log is the file the process writes its output to.
	Log string
	// Started is when the process was started.
	Started time.Time
	// Exited receives the process's end.
	Exited <-chan error
	cmd    *exec.Cmd
	done   chan struct{} // closed once the process has exited
}

// Start runs `bin sub` against etcd at endpoint with env added, its output
// in a file under tb's temporary directory, and stops it (SIGTERM, then
// waits) when tb ends.
func Start(tb testing.TB, bin, sub, endpoint string, env ...string) *Proc {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	logf, err := os.Create(filepath.Join(tb.TempDir(), sub+".log"))
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, sub)
	cmd.Env = append(append(os.Environ(), "HOME="+tb.TempDir(), "VOYAGER_ETCD_ENDPOINTS="+endpoint, "VOYAGER_HTTP_ADDR="+addr), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	p := &Proc{Addr: addr, Log: logf.Name(), Started: time.Now(), cmd: cmd}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		tb.Fatalf("start voyager %s: %v", sub, err)
	}
	exited := make(chan error, 1)
	done := make(chan struct{})
	p.done = done
	go func() {
		exited <- cmd.Wait()
		close(done)
	}()
	p.Exited = exited
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-done
		_ = logf.Close()
	})
	return p
}

// Stop ends the process (SIGTERM) and waits until it has exited.
func (p *Proc) Stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.done
}

// Usage reads the process's peak resident memory (VmHWM, in KiB) and its
// CPU time (user and system) from /proc while it runs.
func (p *Proc) Usage(tb testing.TB) (hwmKiB int64, cpu time.Duration) {
	tb.Helper()
	pid := p.cmd.Process.Pid
	hwmKiB = p.statusKiB(tb, "VmHWM")
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// Fields after the command name, which is in parentheses: utime and
	// stime are the 12th and 13th, in clock ticks (100 a second on Linux).
	rest := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	utime, _ := strconv.ParseInt(rest[11], 10, 64)
	stime, _ := strconv.ParseInt(rest[12], 10, 64)
	return hwmKiB, time.Duration(utime+stime) * 10 * time.Millisecond
}

// RSS reads the process's resident memory now (VmRSS, in KiB).
func (p *Proc) RSS(tb testing.TB) int64 {
	tb.Helper()
	return p.statusKiB(tb, "VmRSS")
}

// statusKiB reads a memory field of the process's /proc/<pid>/status.
func (p *Proc) statusKiB(tb testing.TB, field string) int64 {
	tb.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field+":" {
			kib, _ := strconv.ParseInt(f[1], 10, 64)
			return kib
		}
	}
	tb.Fatalf("no %s in /proc/%d/status", field, p.cmd.Process.Pid)
	return 0
}

// Metrics reads the process's /metrics: each sample name (labels dropped,
// so a histogram's _sum and _count are their own names) with its samples
// added up across labels.
func (p *Proc) Metrics(client *http.Client) (map[string]float64, error) {
	resp, err := client.Get("http://" + p.Addr + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
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
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			out[name] += v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	return out, nil
}

// DeployedGOGC is the GOGC that deploy/systemd/<service>.env sets for
// that service ("100", Go's default, when it sets none), so that a
// benchmark runs a process as it is deployed. It looks for deploy/ in the
// working directory and its parents (a package's tests run in its
// directory).
func DeployedGOGC(tb testing.TB, service string) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatalf("find deploy/systemd: %v", err)
	}
	for {
		env, err := os.ReadFile(filepath.Join(dir, "deploy", "systemd", service+".env"))
		if err == nil {
			for _, l := range strings.Split(string(env), "\n") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(l), "GOGC="); ok {
					return v
				}
			}
			return "100"
		}
		if !os.IsNotExist(err) {
			tb.Fatalf("read %s.env: %v", service, err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatalf("read %s.env: no deploy/systemd/%s.env in the working directory or its parents", service, service)
		}
		dir = parent
	}
}
