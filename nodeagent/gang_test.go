package nodeagent_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
	"github.com/voyager-gpu/voyager/state"
)

// machine is a simulated machine: a network namespace with its own
// address on a bridge of the test host.
type machine struct {
	name, addr, netns string
}

// ipCmd runs ip with args.
func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// freeMachineSubnet is a 10.251.X /24 (as "10.251.X") that no interface
// of this host has an address in: a run killed before its cleanup leaves
// its bridge and address behind, and a second bridge on the same subnet
// would take the machines' traffic.
func freeMachineSubnet(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("ip", "-o", "-4", "addr", "show").Output()
	if err != nil {
		t.Fatalf("list the host's addresses: %v", err)
	}
	for i := range 250 {
		net3 := fmt.Sprintf("10.251.%d", (os.Getpid()+i)%250+1)
		if !strings.Contains(string(out), " "+net3+".") {
			return net3
		}
	}
	t.Fatal("every 10.251.X/24 is in use on this host")
	return ""
}

// machines makes n machines on a bridge of their own, removed when t ends.
func machines(t *testing.T, n int) []machine {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("simulated machines need root (network namespaces)")
	}
	tag := fmt.Sprintf("%05d", os.Getpid()%100000)
	net3 := freeMachineSubnet(t)
	br := "vymb" + tag
	ipCmd(t, "link", "add", br, "type", "bridge")
	_ = runtime.RecordOwner(runtime.Owner{Kind: "link", Name: br})
	t.Cleanup(func() { _ = exec.Command("ip", "link", "delete", br).Run(); _ = runtime.ForgetOwner("link", br) })
	ipCmd(t, "addr", "add", net3+".1/24", "dev", br)
	ipCmd(t, "link", "set", br, "up")
	var ms []machine
	for i := 1; i <= n; i++ {
		m := machine{name: fmt.Sprintf("m%d", i), addr: fmt.Sprintf("%s.%d", net3, 10+i), netns: fmt.Sprintf("isolation-%s-m%d", tag, i)}
		veth := fmt.Sprintf("vymv%s%d", tag, i)
		name := m.netns
		ipCmd(t, "netns", "add", name)
		_ = runtime.RecordOwner(runtime.Owner{Kind: "netns", Name: name})
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "delete", name).Run(); _ = runtime.ForgetOwner("netns", name) })
		ipCmd(t, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", m.netns)
		ipCmd(t, "link", "set", veth, "master", br, "up")
		ipCmd(t, "-n", m.netns, "addr", "add", m.addr+"/24", "dev", "eth0")
		ipCmd(t, "-n", m.netns, "link", "set", "eth0", "up")
		ipCmd(t, "-n", m.netns, "link", "set", "lo", "up")
		ipCmd(t, "-n", m.netns, "route", "add", "default", "via", net3+".1")
		m.netns = "/var/run/netns/" + m.netns
		ms = append(ms, m)
	}
	return ms
}

// machineAgents runs an agent on each of ms, each with its own isolated
// network inside its machine's namespace (named after tag) and the node
// port range first to last, and waits until all registered.
// Each machine's container subnet is its own (a multi-node job's parts
// route to each other's); tune, if given, adjusts each agent's Config.
func machineAgents(t *testing.T, cli *clientv3.Client, ms []machine, tag string, first, last int, tune ...func(*nodeagent.Config)) map[string]nodeagent.Config {
	t.Helper()
	agents := map[string]nodeagent.Config{}
	base := netip.MustParsePrefix(runtime.DefaultSubnet(fmt.Sprintf("%s-%d", tag, os.Getpid()))).Addr().As4()
	for i, m := range ms {
		sub := netip.PrefixFrom(netip.AddrFrom4([4]byte{base[0], base[1], base[2] + byte(i), 0}), 24)
		rt := runtimetest.New(t, runtime.ContainerdOptions{Network: runtime.NetworkOptions{
			Mode: runtime.NetworkIsolated, Name: fmt.Sprintf("%s-%d-%s", tag, os.Getpid(), m.name), StateDir: t.TempDir(),
			HostNetNS: m.netns, BlockedPorts: [2]int{first, last}, Subnet: sub.String(),
		}})
		cfg := testConfig(t, cli, rt)
		cfg.Node, cfg.Address, cfg.ProbeHost, cfg.Image = m.name, m.addr, m.addr, runtimetest.ImageRef
		cfg.Ports = state.PortRange{First: first, Last: last}
		for _, f := range tune {
			f(&cfg)
		}
		runAgent(t, cfg)
		agents[m.name] = cfg
	}
	waitFor(t, fmt.Sprintf("%d machines registered", len(ms)), 20*time.Second, func() (bool, string) {
		for _, m := range ms {
			r, err := cli.Get(context.Background(), keys.Node(m.name), clientv3.WithCountOnly())
			if err != nil || r.Count == 0 {
				return false, m.name + " not registered"
			}
		}
		return true, ""
	})
	return agents
}

// outsideServer serves "outside" on this host's address on the machines'
// network (the world outside, as a session sees it) until t ends, and
// returns its address. Its port is above the ephemeral range: one the
// kernel handed out could fall in the machines' node port range, which
// sessions may not reach.
func outsideServer(t *testing.T, m machine) string {
	t.Helper()
	return serveOutside(t, m.addr[:strings.LastIndexByte(m.addr, '.')]+".1", "outside")
}

// serveOutside serves body on host, at a port above the ephemeral range,
// until t ends, and returns its address (outsideServer's server, on any
// address of this host).
func serveOutside(t *testing.T, host, body string) string {
	t.Helper()
	outside, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(runtimetest.FreePort(t))))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, body) })}
	go func() { _ = srv.Serve(outside) }()
	t.Cleanup(func() { _ = srv.Close() })
	return outside.Addr().String()
}

// bindParts creates session s and binds its parts, each on its node, in
// one transaction as a placer does (all or nothing).
func bindParts(t *testing.T, cli *clientv3.Client, s state.Session, parts []state.Binding) []state.Binding {
	t.Helper()
	ctx := context.Background()
	now := time.Now().UTC()
	s.Created, s.Desired = now, state.DesiredRunning
	if _, err := state.CreateSession(ctx, cli, keys, s, now); err != nil {
		t.Fatal(err)
	}
	pr, err := cli.Get(ctx, keys.Pending(s.ID))
	if err != nil || len(pr.Kvs) == 0 {
		t.Fatalf("read pending: %v", err)
	}
	for attempt := 0; attempt < 10; attempt++ {
		var lws []state.LedgerWrite
		var nodes []string
		for i := range parts {
			b := &parts[i]
			b.Session, b.QueueRevision, b.Bound = s.ID, pr.Kvs[0].ModRevision, now
			l, rev, err := state.Get[state.Ledger](ctx, cli, keys.Ledger(b.Node))
			if err != nil && !errors.Is(err, state.ErrNotFound) {
				t.Fatal(err)
			}
			if l.Allocations == nil {
				l = state.Ledger{Node: b.Node, Allocations: map[string]state.Allocation{}}
			}
			l.Allocations[s.ID] = state.Allocation{Owner: s.Owner, Role: b.Role, CPUMilli: b.CPUMilli, MemoryMiB: b.MemoryMiB, Ports: b.Ports}
			// The node's agent may not have registered yet (its start
			// is not awaited): the bind waits for the node key.
			var nr *clientv3.GetResponse
			waitFor(t, "node "+b.Node+" to register", time.Minute, func() (bool, string) {
				nr, err = cli.Get(ctx, keys.Node(b.Node))
				return err == nil && len(nr.Kvs) > 0, fmt.Sprint(err)
			})
			lws = append(lws, state.LedgerWrite{Node: b.Node, ReadRevision: rev, NodeRevision: nr.Kvs[0].ModRevision, Ledger: l})
			nodes = append(nodes, b.Node)
		}
		cmps, ops, err := state.BindOps(keys, lws, []state.Placement{{
			Session: s.ID, PendingRevision: pr.Kvs[0].ModRevision, Bindings: parts, Secrets: specSecretsOf(t, cli, s.ID),
			Status: state.Status{Session: s.ID, Phase: state.PhaseBound, Nodes: nodes, Created: now, Updated: now, Bound: &now},
		}})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			t.Fatal(err)
		}
		if resp.Succeeded {
			return parts
		}
	}
	t.Fatalf("bind %s: a ledger or node kept changing", s.ID)
	return nil
}

// TestRayGangAcrossMachines: a Ray session's head on one machine and its
// worker on another, each machine a network namespace with its own
// address and its own agent network: the worker reaches the head's Ray
// ports; another owner's session on the worker's machine reaches none of
// them; from outside only Jupyter answers.
func TestRayGangAcrossMachines(t *testing.T) {
	cli := etcdtest.New(t)
	ms := machines(t, 2)
	const first, last = 45000, 45099
	agents := map[string]nodeagent.Config{}
	// The agents' HTTP servers (logs and the Ray dashboard proxy), on
	// this host.
	handlers := map[string]http.Handler{}
	for _, m := range ms {
		rt := runtimetest.New(t, runtime.ContainerdOptions{Network: runtime.NetworkOptions{
			Mode: runtime.NetworkIsolated, Name: fmt.Sprintf("gang-%d-%s", os.Getpid(), m.name), StateDir: t.TempDir(),
			HostNetNS: m.netns, BlockedPorts: [2]int{first, last},
		}})
		cfg := testConfig(t, cli, rt)
		cfg.Node, cfg.Address, cfg.ProbeHost, cfg.Image = m.name, m.addr, m.addr, runtimetest.ImageRef
		cfg.Ports = state.PortRange{First: first, Last: last}
		mux := http.NewServeMux()
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		cfg.LogsBaseURL = srv.URL
		a, _ := runAgent(t, cfg)
		mux.Handle(nodeagent.LogsPath, a.LogsHandler())
		mux.Handle(nodeagent.DashboardPath, a.DashboardHandler())
		handlers[m.name] = mux
		agents[m.name] = cfg
	}
	m1, m2 := ms[0], ms[1]

	// ada's notebook with a Ray head on m1 (Jupyter, GCS, dashboard,
	// client) and one worker on m2 (node and object managers).
	parts := bindParts(t, cli, state.Session{ID: "gang", Owner: "ada", Kind: state.KindNotebook, Ray: &state.Ray{Workers: 1}}, []state.Binding{
		{Node: m1.name, Role: state.RoleHead, CPUMilli: 200, MemoryMiB: 128, Ports: []int{45000, 45001, 45002, 45003}},
		{Node: m2.name, Role: state.RoleWorker, Worker: 1, HeadNode: m1.name, CPUMilli: 200, MemoryMiB: 128, Ports: []int{45010, 45011}},
	})
	waitPhase(t, cli, "gang", state.PhaseRunning, 60*time.Second)
	workerLog := filepath.Join(agents[m2.name].LogDir, nodeagent.ContainerID(parts[1])+".log")
	// Both parts run with the session's Ray token (the stand-in's head
	// shows its fingerprint, and a worker with another is refused, as
	// Ray's token authentication refuses it).
	tok, _, err := state.Get[state.SpecSecrets](context.Background(), cli, keys.SpecSecrets("gang"))
	if err != nil || len(tok.RayToken) < 32 {
		t.Fatalf("Ray token of the gang: %+v, %v", tok, err)
	}
	sum := sha256.Sum256([]byte(tok.RayToken))
	waitFor(t, "the worker to join its head", 60*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(workerLog)
		return strings.Contains(string(b), "joined head "+m1.addr+":45001: ray head of gang auth "+hex.EncodeToString(sum[:])[:16]), string(b)
	})

	// From outside (this host): Jupyter answers; Ray's ports do not.
	c := http.Client{Timeout: 3 * time.Second}
	if resp, err := c.Get("http://" + m1.addr + ":45000/"); err != nil {
		t.Errorf("Jupyter on %s: %v", m1.addr, err)
	} else {
		resp.Body.Close()
	}
	for _, p := range []string{"45001", "45002", "45003"} {
		if resp, err := c.Get("http://" + m1.addr + ":" + p + "/"); err == nil {
			resp.Body.Close()
			t.Errorf("port %s of the head answers from outside the gang", p)
		}
	}

	// The dashboard (on the container's address, published nowhere)
	// through the head's agent, opened by the key of the head's log URL;
	// without it, or with another container's, refused.
	sec, _, err := state.Get[state.Secrets](context.Background(), cli, keys.Secret(m1.name, "gang"))
	if err != nil || sec.URLs["logs"] == "" {
		t.Fatalf("secrets of the head: %+v, %v; want a log URL", sec, err)
	}
	dash, err := state.DashboardURL(sec.URLs["logs"])
	if err != nil {
		t.Fatal(err)
	}
	var page string
	waitFor(t, "the dashboard through the agent", 20*time.Second, func() (bool, string) {
		resp, err := c.Get(dash.String())
		if err != nil {
			return false, err.Error()
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		page = string(b)
		return resp.StatusCode == http.StatusOK, resp.Status + ": " + page
	})
	if !strings.Contains(page, "ray dashboard stand-in of gang") {
		t.Errorf("dashboard page %q", page)
	}
	api := *dash
	api.Path += "api/version"
	if resp, err := c.Get(api.String()); err != nil {
		t.Errorf("dashboard API: %v", err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), `"ray_version": "stand-in"`) {
			t.Errorf("dashboard API answered %s %q", resp.Status, b)
		}
	}
	for name, u := range map[string]string{
		"no key":                   strings.Split(dash.String(), "?")[0],
		"a forged key":             strings.Replace(dash.String(), "key=", "key=0", 1),
		"another container's path": strings.Replace(dash.String(), nodeagent.ContainerID(parts[0]), "eve-job-q1", 1),
	} {
		resp, err := c.Get(u)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("dashboard with %s: %s, want 403 Forbidden", name, resp.Status)
		}
	}

	// eve's session on m2, the worker's machine: none of the head's ports,
	// though the world outside (here, a server on this host's address on
	// the machines' network) answers it.
	probe := fmt.Sprintf("if timeout 3 wget -q -O - http://%s/ >/dev/null 2>&1; then echo OUTSIDE REACHED; fi; ", outsideServer(t, m1))
	for _, p := range []string{"45000", "45001", "45002", "45003"} {
		probe += fmt.Sprintf("if timeout 3 wget -q -O - http://%s:%s/ >/dev/null 2>&1; then echo REACHED %s; else echo REFUSED %s; fi; ", m1.addr, p, p, p)
	}
	probe += fmt.Sprintf("if timeout 3 wget -q -O - http://%s:45011/ >/dev/null 2>&1; then echo REACHED worker; else echo REFUSED worker; fi", m2.addr)
	eve := bindParts(t, cli, state.Session{ID: "eve-job", Owner: "eve", Kind: state.KindBatch, Command: []string{"sh", "-c", probe}},
		[]state.Binding{{Node: m2.name, Role: state.RoleSingle, CPUMilli: 100, MemoryMiB: 64}})
	waitPhase(t, cli, "eve-job", state.PhaseSucceeded, 60*time.Second)
	var out []byte
	waitFor(t, "eve's probe to report in its log", 10*time.Second, func() (bool, string) { // the shim may copy it a moment after the exit
		out, _ = os.ReadFile(filepath.Join(agents[m2.name].LogDir, nodeagent.ContainerID(eve[0])+".log"))
		return strings.Contains(string(out), " worker\n"), string(out) // the last probe's line
	})
	if !strings.Contains(string(out), "OUTSIDE REACHED") || strings.Contains(string(out), "\nREACHED") || strings.Count(string(out), "REFUSED") != 5 {
		t.Errorf("another owner's session reached the gang:\n%s", out)
	}
}
