package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/internal/etcdrbac"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/internal/pki"
	"github.com/voyager-gpu/voyager/internal/testreq"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
	"github.com/voyager-gpu/voyager/state"
)

// secureCluster is a Voyager cluster with TLS everywhere and etcd
// authentication on: its certificates (written by voyager certs), its
// etcd members and the environment each identity runs with.
type secureCluster struct {
	t         *testing.T
	pki       string
	endpoints []string
	peers     []string // the members' peer URLs
	members   map[string]*exec.Cmd
	base      []string // environment every process shares
}

// runVoyager runs the built binary to completion (killed after two
// minutes) and returns its exit code and output.
func runVoyager(t *testing.T, environ []string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, binary, args...)
	c.Env = environ
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	_ = c.Run()
	return c.ProcessState.ExitCode(), out.String()
}

// etcdMember is one member to start: its name, the network namespace it
// runs in ("" for the host's) and its client and peer host:port.
type etcdMember struct{ name, ns, client, peer string }

// startSecureEtcd writes the cluster's certificates with voyager certs for
// the named nodes and starts n etcd members (Debian's etcd) on loopback.
func startSecureEtcd(t *testing.T, n int, nodes []string) *secureCluster {
	t.Helper()
	var ms []etcdMember
	for i := range n {
		ms = append(ms, etcdMember{fmt.Sprintf("vdep-etcd-%d", i+1), "", etcdtest.FreeAddr(t), etcdtest.FreeAddr(t)})
	}
	args := []string{"--api-hosts", "127.0.0.1"}
	for _, node := range nodes {
		args = append(args, "--node", node+"=127.0.0.1")
	}
	return startSecureEtcdMembers(t, ms, args)
}

// startSecureEtcdMembers writes the certificates with voyager certs (the
// members' and those certArgs ask for) and starts the members, serving
// TLS to clients and peers with client-certificate authentication on both.
func startSecureEtcdMembers(t *testing.T, ms []etcdMember, certArgs []string) *secureCluster {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		testreq.Missing(t, "etcd-server", fmt.Sprintf("etcd server not found (%v): install Debian's etcd-server", err))
	}
	dir := t.TempDir()
	c := &secureCluster{t: t, pki: filepath.Join(dir, "pki"), members: map[string]*exec.Cmd{}}
	args := append([]string{"certs", "--dir", c.pki, "--validity", "2h", "--ca-validity", "3h"}, certArgs...)
	var cluster []string
	for _, m := range ms {
		host, _, _ := strings.Cut(m.client, ":")
		args = append(args, "--etcd", m.name+"="+host)
		cluster = append(cluster, m.name+"=https://"+m.peer)
		c.endpoints = append(c.endpoints, "https://"+m.client)
		c.peers = append(c.peers, "https://"+m.peer)
	}
	if code, out := runVoyager(t, nil, args...); code != 0 {
		t.Fatalf("voyager certs: exit %d\n%s", code, out)
	}
	ca, peerCA := filepath.Join(c.pki, "ca.pem"), filepath.Join(c.pki, "peer-ca.pem")
	for _, m := range ms {
		cert, key := filepath.Join(c.pki, "etcd", m.name+".pem"), filepath.Join(c.pki, "etcd", m.name+"-key.pem")
		peerCert, peerKey := filepath.Join(c.pki, "etcd", m.name+"-peer.pem"), filepath.Join(c.pki, "etcd", m.name+"-peer-key.pem")
		eargs := []string{
			"--name", m.name, "--data-dir", filepath.Join(dir, m.name),
			"--listen-client-urls", "https://" + m.client, "--advertise-client-urls", "https://" + m.client,
			"--listen-peer-urls", "https://" + m.peer, "--initial-advertise-peer-urls", "https://" + m.peer,
			"--initial-cluster", strings.Join(cluster, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "vdep-" + filepath.Base(dir),
			"--cert-file", cert, "--key-file", key, "--trusted-ca-file", ca, "--client-cert-auth",
			// Peers as deploy/systemd/etcd.env: their own CA and CN.
			"--peer-cert-file", peerCert, "--peer-key-file", peerKey, "--peer-trusted-ca-file", peerCA, "--peer-client-cert-auth",
			"--peer-cert-allowed-cn", peerCN,
			"--pre-vote", "--unsafe-no-fsync", "--log-level", "error"} // pre-vote as deploy/systemd/etcd.env
		cmd := exec.Command(bin, eargs...)
		if m.ns != "" {
			cmd = inNetNS(m.ns, bin, eargs...)
		}
		logf, err := os.Create(filepath.Join(dir, m.name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatalf("start etcd: %v", err)
		}
		c.members[m.name] = cmd
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			_ = logf.Close()
			if t.Failed() {
				b, _ := os.ReadFile(logf.Name())
				t.Logf("%s log:\n%s", m.name, b)
			}
		})
	}
	c.base = []string{
		"VOYAGER_ETCD_ENDPOINTS=" + strings.Join(c.endpoints, ","),
		"VOYAGER_ETCD_CA=" + ca,
		"VOYAGER_LOG_LEVEL=debug",
	}
	root := c.client(etcdrbac.Root)
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := root.Get(ctx, "/voyager")
		cancel()
		if err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd cluster did not answer within 60s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// as is the environment of a process with identity user.
func (c *secureCluster) as(user string, more ...string) []string {
	env := append(slices.Clone(c.base),
		"VOYAGER_ETCD_CERT="+filepath.Join(c.pki, user+".pem"),
		"VOYAGER_ETCD_KEY="+filepath.Join(c.pki, user+"-key.pem"))
	return append(env, more...)
}

// https is the environment of a process serving HTTPS at addr with user's
// certificate.
func (c *secureCluster) https(user, addr string) []string {
	return []string{
		"VOYAGER_HTTP_ADDR=" + addr,
		"VOYAGER_HTTP_TLS_CERT=" + filepath.Join(c.pki, user+".pem"),
		"VOYAGER_HTTP_TLS_KEY=" + filepath.Join(c.pki, user+"-key.pem"),
	}
}

func (c *secureCluster) tlsConfig(user string) *tls.Config {
	c.t.Helper()
	pool := x509.NewCertPool()
	b, err := os.ReadFile(filepath.Join(c.pki, "ca.pem"))
	if err != nil || !pool.AppendCertsFromPEM(b) {
		c.t.Fatalf("read CA: %v", err)
	}
	tc := &tls.Config{RootCAs: pool}
	if user != "" {
		pair, err := tls.LoadX509KeyPair(filepath.Join(c.pki, user+".pem"), filepath.Join(c.pki, user+"-key.pem"))
		if err != nil {
			c.t.Fatal(err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc
}

// client is an etcd client authenticated as user by its certificate.
func (c *secureCluster) client(user string) *clientv3.Client {
	c.t.Helper()
	// Pinged as Voyager's own clients are (config.EtcdClientConfig), so
	// that a member gone silent does not hang the test's reads.
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.endpoints, DialTimeout: 5 * time.Second, TLS: c.tlsConfig(user), Logger: zap.NewNop(),
		DialKeepAliveTime: config.EtcdKeepAlive, DialKeepAliveTimeout: config.EtcdKeepAliveTimeout})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// leader returns the name of the member that leads now, or "" while
// none does.
func (c *secureCluster) leader(ctx context.Context, cli *clientv3.Client) string {
	c.t.Helper()
	for _, ep := range c.endpoints {
		sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		st, err := cli.Status(sctx, ep)
		cancel()
		if err != nil {
			continue
		}
		if st.Header.MemberId == st.Leader && st.Leader != 0 {
			ml, err := cli.MemberList(ctx)
			if err != nil {
				c.t.Fatal(err)
			}
			for _, m := range ml.Members {
				if m.ID == st.Leader {
					return m.Name
				}
			}
		}
	}
	return ""
}

// inNetNS is a command that runs bin in the network namespace named ns
// (ip netns add). It enters the network namespace only: `ip netns exec`
// also gives the process a mount namespace of its own, where the network
// namespaces an agent makes for its containers would stay invisible to
// containerd.
func inNetNS(ns, bin string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=/run/netns/" + ns, "--", bin}, args...)...)
}

// voyagerIn starts the built binary with environ inside network namespace
// ns, or on the host for "".
func voyagerIn(t *testing.T, ns string, environ []string, args ...string) *proc {
	t.Helper()
	if ns == "" {
		return start(t, environ, args...)
	}
	cmd := inNetNS(ns, binary, args...)
	cmd.Env = environ
	return startCmd(t, cmd, ns+": "+strings.Join(args, " "))
}

// setupRoles runs voyager etcd-roles setup and check as root for nodes.
func (c *secureCluster) setupRoles(nodes []string) {
	c.t.Helper()
	args := []string{"etcd-roles", "setup"}
	for _, n := range nodes {
		args = append(args, "--node", n)
	}
	rootEnv := c.as(etcdrbac.Root)
	if code, out := runVoyager(c.t, rootEnv, args...); code != 0 || !strings.Contains(out, "authentication: enabled") {
		c.t.Fatalf("etcd-roles setup: exit %d\n%s", code, out)
	}
	args[1] = "check"
	if code, out := runVoyager(c.t, rootEnv, args...); code != 0 || !strings.Contains(out, "ok:") {
		c.t.Fatalf("etcd-roles check: exit %d\n%s", code, out)
	}
}

// startAPI starts an API in ns serving HTTPS on addr.
func (c *secureCluster) startAPI(ns, addr, secret string) *proc {
	c.t.Helper()
	p := voyagerIn(c.t, ns, c.as(etcdrbac.API, append(c.https(etcdrbac.API, addr), "VOYAGER_JWT_SECRET="+secret)...), "api")
	p.waitFor(`msg="api listening"`, 30*time.Second)
	return p
}

// startPlacer starts a placer in ns (spread, a 2 s membership lease).
func (c *secureCluster) startPlacer(ns, httpAddr string) *proc {
	c.t.Helper()
	p := voyagerIn(c.t, ns, c.as(etcdrbac.Placer, "VOYAGER_HTTP_ADDR="+httpAddr, "VOYAGER_PLACER_STRATEGY=spread",
		"VOYAGER_PLACER_LEASE_TTL=2s", "VOYAGER_DATA_DIR="+c.t.TempDir()), "placer")
	p.waitFor(`msg="placer caches synced"`, 30*time.Second)
	return p
}

// agentLeaseTTL is the agents' lease TTL in these clusters, the default,
// and agentFenceAfter their fence deadline, longer than the default (half
// the TTL). An agent renews every third of its fence deadline, so an
// outage that begins just before a renewal is due must end within two
// thirds of it, or the agent fences its node. The death of the etcd leader
// is such an outage: no lease is renewed for one to two election timeouts
// (1 s each), and more on a loaded machine: 1.0-2.4 s in this test beside
// the whole suite, 4.1 s once beside the suite and another race-enabled
// test. With a 4 s TTL CI saw an agent fence the long job that must outlive
// the leader (27 November, no renewal for 3.1 s); at the default deadline
// (5 s) an outage of 3.3 s can fence; at 7 s, 4.7 s. Fence deadline plus
// grace (a fifth of the TTL, 2 s) stays below the TTL.
const (
	agentLeaseTTL   = 10 * time.Second
	agentFenceAfter = 7 * time.Second
)

// agentSubnets holds the container subnet of each node whose agent this
// test binary started: 10.120.n.0/24, n counting the nodes.
var agentSubnets = struct {
	sync.Mutex
	of map[string]string
}{of: map[string]string{}}

// agentSubnet is node's container subnet, the same at each start of its
// agent (a restarted agent finds its network as it left it) and another
// for every other node, so that no two agents of a test share one.
func agentSubnet(node string) string {
	agentSubnets.Lock()
	defer agentSubnets.Unlock()
	if s, ok := agentSubnets.of[node]; ok {
		return s
	}
	s := fmt.Sprintf("10.120.%d.0/24", len(agentSubnets.of)%256)
	agentSubnets.of[node] = s
	return s
}

// startAgent starts node's agent in ns, reachable at address with its
// HTTPS log endpoint on httpAddr (client certificates of the cluster CA
// only), running sessions in containerd namespace node of rt with two
// simulated GPUs, an agentLeaseTTL lease and agentFenceAfter. It returns
// the agent and the directory of its users' homes.
func (c *secureCluster) startAgent(ns, node, address, httpAddr string, rt *runtime.Containerd, ports string) (*proc, string) {
	c.t.Helper()
	return c.startAgentTimed(ns, node, address, httpAddr, rt, ports, agentTimings{ttl: agentLeaseTTL, fenceAfter: agentFenceAfter})
}

// startAgentTimed is startAgent with the lease and fence timings tm.
func (c *secureCluster) startAgentTimed(ns, node, address, httpAddr string, rt *runtime.Containerd, ports string, tm agentTimings) (*proc, string) {
	c.t.Helper()
	home := c.t.TempDir()
	user := etcdrbac.Agent(node)
	env := append(c.https(user, httpAddr),
		"HOME="+home, "VOYAGER_DATA_DIR="+home+"/data", "VOYAGER_HTTP_CLIENT_CA="+filepath.Join(c.pki, "ca.pem"),
		"VOYAGER_AGENT_NODE="+node, "VOYAGER_AGENT_ADDRESS="+address,
		"VOYAGER_AGENT_CONTAINERD="+rt.Address(), "VOYAGER_AGENT_NAMESPACE="+node, "VOYAGER_AGENT_PORTS="+ports,
		"VOYAGER_AGENT_SIMULATE_GPUS=2xA100-80GB", "VOYAGER_AGENT_IMAGE="+agentTestImage, "VOYAGER_AGENT_STOP_GRACE=1s",
		// A subnet of its own: the default, hashed from a name with the
		// temporary directory in it, is one /24 of 16,384 and two agents
		// of a test once drew the same (their job mesh refuses that).
		"VOYAGER_AGENT_NETWORK_SUBNET="+agentSubnet(node))
	p := voyagerIn(c.t, ns, c.as(user, append(env, tm.environ()...)...), "agent")
	p.waitFor(`msg="node registered"`, 60*time.Second)
	return p, filepath.Join(home, "data", "homes")
}

// cliEnv is the environment of the CLI against the API at apiAddr, as
// user ada: it trusts the cluster CA through Go's SSL_CERT_FILE.
func (c *secureCluster) cliEnv(apiAddr, secret string) []string {
	c.t.Helper()
	env := []string{"HOME=" + c.t.TempDir(), "SSL_CERT_FILE=" + filepath.Join(c.pki, "ca.pem"),
		envURL + "=https://" + apiAddr, "VOYAGER_JWT_SECRET=" + secret}
	return append(env, envToken+"="+binaryToken(c.t, env, "--sub", "ada"))
}

// runJobs runs n `voyager run --gpus 2` jobs at once (each node has two
// GPUs, so with spread each lands on its own node) and requires each to
// print its output and exit 3, the job's code.
func runJobs(t *testing.T, env []string, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			code, out := runVoyager(t, env, "run", "--gpus", "2", "--", "sh", "-c", "sleep 1; echo hi from the job; exit 3")
			if code != 3 || !strings.Contains(out, "hi from the job") {
				t.Errorf("voyager run: exit %d, want 3 with its output:\n%s", code, out)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
}

// nodesOfStatuses returns the nodes that the statuses under status/ name,
// read with cli.
func nodesOfStatuses(t *testing.T, ctx context.Context, cli *clientv3.Client) map[string]bool {
	t.Helper()
	resp, err := cli.Get(ctx, keys.StatusDir(), clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("read statuses: %v", err)
	}
	out := map[string]bool{}
	for _, kv := range resp.Kvs {
		st, err := state.Decode[state.Status](kv.Value)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range st.Nodes {
			out[n] = true
		}
	}
	return out
}

// checkRefusals: the operator reads no secrets, an agent cannot write
// another node's binding, ledger, inventory or parts, nor any session's
// status (also of the sessions it ran), the API cannot write a
// ledger, and an agent's log endpoint and etcd refuse a client without a
// certificate of the cluster CA.
func (c *secureCluster) checkRefusals(ctx context.Context, nodes []string, agentHTTP string) {
	t := c.t
	t.Helper()
	if _, err := c.client(etcdrbac.Operator).Get(ctx, keys.SecretsDir(), clientv3.WithPrefix()); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("operator reading secrets/: %v, want permission denied", err)
	}
	agentA := c.client(etcdrbac.Agent(nodes[0]))
	// No status at all, not even of a session it ran: statuses are the
	// placers' merger's, from the parts (parts/<node>/<id>).
	forbidden := []string{keys.Binding(nodes[1], "s-forged"), keys.Ledger(nodes[1]), keys.Node(nodes[1]),
		keys.Part(nodes[1], "s-forged"), keys.Status("s-forged")}
	resp, err := c.client(etcdrbac.Operator).Get(ctx, keys.StatusDir(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		forbidden = append(forbidden, string(kv.Key))
	}
	if len(resp.Kvs) == 0 {
		t.Error("no status to try to overwrite: the jobs left none")
	}
	for _, key := range forbidden {
		if _, err := agentA.Put(ctx, key, `{}`); !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("agent %s writing %s: %v, want permission denied", nodes[0], key, err)
		}
	}
	for _, kv := range resp.Kvs {
		if _, err := agentA.Delete(ctx, string(kv.Key)); !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("agent %s deleting %s: %v, want permission denied", nodes[0], kv.Key, err)
		}
	}
	// Its own node's parts it may write (the merger deletes a stray one).
	if _, err := agentA.Put(ctx, keys.Part(nodes[0], "s-own"), `{}`); err != nil {
		t.Errorf("agent %s writing its own part: %v", nodes[0], err)
	}
	if _, err := c.client(etcdrbac.API).Put(ctx, keys.Ledger(nodes[0]), `{}`); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("api writing a ledger: %v, want permission denied", err)
	}
	other, err := pki.NewCA("another CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := other.Issue(pki.Request{CommonName: etcdrbac.API, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	withForeign := c.tlsConfig("")
	withForeign.Certificates = []tls.Certificate{foreign}
	for _, cl := range []struct {
		name string
		tc   *tls.Config
		ok   bool
	}{
		{"no certificate", c.tlsConfig(""), false},
		{"another CA's certificate", withForeign, false},
		{"the cluster CA's certificate", c.tlsConfig(etcdrbac.Operator), true},
	} {
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cl.tc}}
		resp, err := hc.Get("https://" + agentHTTP + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		if (err == nil) != cl.ok {
			t.Errorf("agent's log endpoint, client with %s: %v; want accepted %v", cl.name, err, cl.ok)
		}
	}
	// etcd refuses the foreign certificate too, although its CN is a user.
	fcli, err := clientv3.New(clientv3.Config{Endpoints: c.endpoints, DialTimeout: 2 * time.Second, TLS: withForeign, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer fcli.Close()
	fctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := fcli.Get(fctx, keys.StatusDir(), clientv3.WithPrefix()); err == nil {
		t.Error("etcd answered a client with another CA's certificate")
	}
}

// killLeader kills the etcd leader and returns its name and how long the
// others took to elect a new one.
func (c *secureCluster) killLeader(ctx context.Context) (string, time.Duration) {
	c.t.Helper()
	root := c.client(etcdrbac.Root)
	leader := c.leader(ctx, root)
	for waited := time.Now(); leader == ""; leader = c.leader(ctx, root) {
		if time.Since(waited) > 30*time.Second {
			c.t.Fatal("no etcd leader to kill within 30s")
		}
		time.Sleep(20 * time.Millisecond) // polling the members' status, bounded above
	}
	killed := time.Now()
	if err := c.members[leader].Process.Kill(); err != nil {
		c.t.Fatal(err)
	}
	for {
		if l := c.leader(ctx, root); l != "" && l != leader {
			return leader, time.Since(killed)
		}
		if time.Since(killed) > 30*time.Second {
			c.t.Fatal("no new etcd leader within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSecureClusterE2E runs Voyager as it is deployed, on loopback: three
// etcd members with TLS (clients and peers) and authentication on, the
// roles set up by voyager etcd-roles, an API serving HTTPS, two placers and
// two agents on real containerd, each process with its own certificate and
// etcd user. Jobs submitted with voyager run over HTTPS run on both nodes
// and their logs come back through the agents' mutual-TLS log endpoints.
// Then the etcd leader and a placer are killed, and the next jobs still
// run. TestMultiMachineE2E does the same across network namespaces.
func TestSecureClusterE2E(t *testing.T) {
	needBinary(t)
	nodes := []string{"vdep-a", "vdep-b"}
	rt := privateContainerd(t, nodes[0])
	namespaceRuntime(t, rt.Address(), nodes[1])
	c := startSecureEtcd(t, 3, nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c.setupRoles(nodes)

	secret := "vdep-" + strings.Repeat("s", 40)
	apiAddr := etcdtest.FreeAddr(t)
	c.startAPI("", apiAddr, secret)
	placers := []*proc{c.startPlacer("", etcdtest.FreeAddr(t)), c.startPlacer("", etcdtest.FreeAddr(t))}
	agentHTTP := map[string]string{}
	for i, n := range nodes {
		agentHTTP[n] = etcdtest.FreeAddr(t)
		_, _ = c.startAgent("", n, "127.0.0.1", agentHTTP[n], rt, fmt.Sprintf("%d-%d", 47100+50*i, 47149+50*i))
	}
	// Each process is ready: its /readyz reads etcd as its own user.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: c.tlsConfig(etcdrbac.Operator)}}
	for what, addr := range map[string]string{"api": apiAddr, "agent": agentHTTP[nodes[0]]} {
		resp, err := hc.Get("https://" + addr + "/readyz")
		if err != nil {
			t.Fatalf("%s /readyz: %v", what, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s /readyz: %d %s", what, resp.StatusCode, body)
		}
	}
	cliEnv := c.cliEnv(apiAddr, secret)
	runJobs(t, cliEnv, 2)
	if on := nodesOfStatuses(t, ctx, c.client(etcdrbac.Operator)); len(on) != 2 {
		t.Fatalf("jobs ran on %v; want one on each of %v", on, nodes)
	}
	c.checkRefusals(ctx, nodes, agentHTTP[nodes[0]])
	c.checkSecrets(ctx, cliEnv, nodes)
	c.checkPeerPort(ctx, nodes)

	// Kill the etcd leader and a placer. The remaining members elect a
	// leader; the CLI retries a create that etcd could not answer
	// meanwhile (same idempotency key), and the jobs run.
	killed := time.Now()
	leader, elected := c.killLeader(ctx)
	if err := placers[0].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	runJobs(t, cliEnv, 2)
	t.Logf("killed etcd leader %s and a placer: new leader after %s, two jobs ran to completion %s after the kills",
		leader, elected.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
}

// vnet is a network of "machines" on one host: a Linux bridge and, per
// machine, a network namespace with its own address on it, reached
// through a veth pair. Names are prefixed vdep- and made unique per test.
type vnet struct {
	t      *testing.T
	id     string
	bridge string
	subnet string            // the first three octets, e.g. 10.213.7
	ns     map[string]string // machine → namespace
	ip     map[string]string // machine → address
	veth   map[string]string // machine → host end of its veth
}

// ipCmd runs ip with args and fails the test on an error.
func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// newVNet makes a machine per name. The host is .1 on the bridge.
func newVNet(t *testing.T, names ...string) *vnet {
	t.Helper()
	if os.Geteuid() != 0 {
		testreq.Missing(t, "root", "network namespaces need root")
	}
	id := fmt.Sprintf("%04x", time.Now().UnixNano()&0xffff)
	n := &vnet{t: t, id: id, bridge: "vdep" + id, subnet: fmt.Sprintf("10.213.%d", 1+time.Now().UnixNano()%250),
		ns: map[string]string{}, ip: map[string]string{}, veth: map[string]string{}}
	ipCmd(t, "link", "add", n.bridge, "type", "bridge")
	_ = runtime.RecordOwner(runtime.Owner{Kind: "link", Name: n.bridge})
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", n.bridge).Run()
		_ = runtime.ForgetOwner("link", n.bridge)
	})
	ipCmd(t, "addr", "add", n.subnet+".1/24", "dev", n.bridge)
	ipCmd(t, "link", "set", n.bridge, "up")
	for i, name := range names {
		ns, host, peer := "vdep-"+id+"-"+name, fmt.Sprintf("vd%s%d", id, i), fmt.Sprintf("vd%s%dp", id, i)
		ipCmd(t, "netns", "add", ns)
		_ = runtime.RecordOwner(runtime.Owner{Kind: "netns", Name: ns})
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run(); _ = runtime.ForgetOwner("netns", ns) })
		ipCmd(t, "link", "add", host, "type", "veth", "peer", "name", peer)
		ipCmd(t, "link", "set", peer, "netns", ns)
		ipCmd(t, "-n", ns, "link", "set", peer, "name", "eth0")
		addr := fmt.Sprintf("%s.%d", n.subnet, 10+i)
		ipCmd(t, "-n", ns, "addr", "add", addr+"/24", "dev", "eth0")
		ipCmd(t, "-n", ns, "link", "set", "eth0", "up")
		ipCmd(t, "-n", ns, "link", "set", "lo", "up")
		ipCmd(t, "link", "set", host, "master", n.bridge, "up")
		n.ns[name], n.ip[name], n.veth[name] = ns, addr, host
	}
	return n
}

// machines is a secured cluster across network namespaces on one bridge
// (a vnet): three etcd members (etcd-1, etcd-2, etcd-3: TLS for clients
// and peers, authentication on, the roles set up), control machines and
// GPU machines. Each GPU machine's node, vdep-<net>-<machine>, runs its
// sessions in a namespace of its own on one private containerd. The
// processes are the test's to start.
type machines struct {
	*secureCluster
	net     *vnet
	nodes   []string // the GPU machines' nodes, in their order
	rt      *runtime.Containerd
	members []etcdMember
}

// startMachines makes the network of the machines (the control machines
// ctls and the GPU machines gpus beside the etcd members), starts the
// etcd members and sets up etcd's users and roles.
func startMachines(t *testing.T, ctls, gpus []string) *machines {
	t.Helper()
	etcds := []string{"etcd-1", "etcd-2", "etcd-3"}
	net := newVNet(t, slices.Concat(etcds, ctls, gpus)...)
	m := &machines{net: net}
	for _, g := range gpus {
		m.nodes = append(m.nodes, "vdep-"+net.id+"-"+g)
	}
	m.rt = privateContainerd(t, m.nodes[0])
	for _, n := range m.nodes[1:] {
		namespaceRuntime(t, m.rt.Address(), n)
	}
	for _, e := range etcds {
		m.members = append(m.members, etcdMember{e, net.ns[e], net.ip[e] + ":2379", net.ip[e] + ":2380"})
	}
	var apiHosts []string
	for _, ctl := range ctls {
		apiHosts = append(apiHosts, net.ip[ctl])
	}
	certArgs := []string{"--api-hosts", strings.Join(apiHosts, ",")}
	for i, g := range gpus {
		certArgs = append(certArgs, "--node", m.nodes[i]+"="+net.ip[g])
	}
	m.secureCluster = startSecureEtcdMembers(t, m.members, certArgs)
	m.setupRoles(m.nodes)
	return m
}

// TestMultiMachineE2E runs a secured cluster across eight "machines", each
// a network namespace with its own address on a bridge: three etcd
// members (TLS for clients and peers, authentication on), two control
// machines with an API and a placer each, and three GPU machines with an
// agent each, all on one real containerd. Every process has its own
// certificate and etcd user. Jobs go through both APIs and run on every
// GPU machine; a GPU machine is killed (its agent and its link) and its
// session leaves Running within the lease TTL + 1 s; an etcd follower goes
// silent (its link down) and no agent fences; then the etcd leader and a
// control machine's placer are killed and jobs still run.
func TestMultiMachineE2E(t *testing.T) {
	needBinary(t)
	gpus := []string{"gpu-1", "gpu-2", "gpu-3"}
	machines := startMachines(t, []string{"ctl-1", "ctl-2"}, gpus)
	c, net, nodes, rt, ms := machines.secureCluster, machines.net, machines.nodes, machines.rt, machines.members
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	secret := "vdep-" + strings.Repeat("m", 40)
	apis := map[string]string{}
	placers := map[string]*proc{}
	for _, ctl := range []string{"ctl-1", "ctl-2"} {
		apis[ctl] = net.ip[ctl] + ":7443"
		c.startAPI(net.ns[ctl], apis[ctl], secret)
		placers[ctl] = c.startPlacer(net.ns[ctl], net.ip[ctl]+":7070")
	}
	agents := map[string]*proc{}
	for i, g := range gpus {
		var homes string
		agents[nodes[i]], homes = c.startAgent(net.ns[g], nodes[i], net.ip[g], net.ip[g]+":7071", rt, fmt.Sprintf("%d-%d", 47300+50*i, 47349+50*i))
		writeRayStandIn(t, filepath.Join(homes, "ada"))
		writeRendezvous(t, filepath.Join(homes, "ada"))
	}

	// Three 2-GPU jobs through ctl-1's API: one on each GPU machine, their
	// output streamed back from each agent's log endpoint across the bridge.
	runJobs(t, c.cliEnv(apis["ctl-1"], secret), 3)
	operator, root := c.client(etcdrbac.Operator), c.client(etcdrbac.Root)
	if on := nodesOfStatuses(t, ctx, operator); len(on) != 3 {
		t.Fatalf("jobs ran on %v; want one on each of %v", on, nodes)
	}
	c.checkRefusals(ctx, nodes, net.ip["gpu-1"]+":7071")
	var cp []string
	for _, m := range ms {
		cp = append(cp, m.client, m.peer)
	}
	for _, ctl := range []string{"ctl-1", "ctl-2"} {
		cp = append(cp, apis[ctl], net.ip[ctl]+":7070")
	}
	for _, g := range gpus {
		cp = append(cp, net.ip[g]+":7071")
	}
	checkControlPlaneUnreachable(t, c.cliEnv(apis["ctl-1"], secret), net.ns["ctl-2"], cp, net.ip["ctl-2"]+":"+strconv.Itoa(controlPlaneProbePort))

	// A gang: a Ray head and a worker of two GPUs each, so on two machines,
	// bound in one transaction; the worker gets the head's address on the
	// bridge (Ray itself is not packaged here: a stand-in on the user's
	// PATH starts and blocks like it), and the head's exit ends both.
	code, out := runVoyager(t, c.cliEnv(apis["ctl-1"], secret), "run", "--gpus", "2", "--ray-workers", "1",
		"--env", "PATH=/home/jovyan/bin:/bin", "--", "sh", "-c", "echo gang head; exit 3")
	m := regexp.MustCompile(`session (\S+) submitted`).FindStringSubmatch(out)
	if code != 3 || !strings.Contains(out, "gang head") || m == nil {
		t.Fatalf("gang: exit %d, want 3 with its output:\n%s", code, out)
	}
	gang, _, err := state.Get[state.Status](ctx, operator, keys.Status(m[1]))
	if err != nil || len(gang.Nodes) != 2 || gang.Nodes[0] == gang.Nodes[1] {
		t.Fatalf("gang status %+v (%v); want its head and worker on two machines", gang, err)
	}
	t.Logf("gang %s ran on %v", m[1], gang.Nodes)
	// The head's end ends the gang: the worker is stopped and released too.
	waitReleased(t, ctx, root, m[1], 20*time.Second)

	// A multi-node job, one part of two GPUs on each GPU machine: the
	// parts rendezvous at rank 0's MASTER_ADDR:MASTER_PORT and reach each
	// other's peer ports across the bridge (the test image's stand-in of
	// torchrun's rendezvous, on ada's PATH), and voyager run prints every
	// part's output, rank-prefixed, read from each machine's agent.
	code, out = runVoyager(t, c.cliEnv(apis["ctl-1"], secret), "run", "-nodes", "3", "-gpus", "2",
		"-env", "PATH=/home/jovyan/bin:/bin", "--", "rendezvous", "-timeout", "60s")
	if code != 0 {
		t.Fatalf("multi-node job: exit %d, want 0:\n%s", code, out)
	}
	for r := 0; r < 3; r++ {
		if line := fmt.Sprintf("[rank %d] rendezvous: rank %d of 3: connected to every other rank", r, r); !strings.Contains(out, line) {
			t.Errorf("multi-node job's output lacks %q:\n%s", line, out)
		}
	}

	// One part of a multi-node job fails while the others run on: the
	// job ends with that part's exit code (onPartFailure StopAll, the
	// default) and the other parts are stopped and released.
	code, out = runVoyager(t, c.cliEnv(apis["ctl-1"], secret), "run", "-nodes", "3", "-gpus", "2", "--",
		"sh", "-c", `if [ "$NODE_RANK" = 2 ]; then echo failing; exit 7; fi; exec sleep 600`)
	if m := regexp.MustCompile(`session (\S+) submitted`).FindStringSubmatch(out); code != 7 || !strings.Contains(out, "[rank 2] failing") || m == nil {
		t.Fatalf("multi-node job with a failing part: exit %d, want 7 with the part's output:\n%s", code, out)
	} else {
		waitReleased(t, ctx, root, m[1], 20*time.Second)
	}

	checkRayDashboard(t, ctx, c.cliEnv(apis["ctl-1"], secret), root)

	// A long job, then its machine dies: agent killed, link down.
	ctl2 := c.cliEnv(apis["ctl-2"], secret)
	code, out = runVoyager(t, ctl2, "session", "create", "--kind", "batch", "--gpus", "2", "-o", "json", "--", "sleep", "600")
	if code != 0 {
		t.Fatalf("session create: exit %d\n%s", code, out)
	}
	var created struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(out), &created); err != nil || created.ID == "" {
		t.Fatalf("session create printed %q (%v)", out, err)
	}
	st := waitStatus(t, ctx, root, created.ID, "Running", func(st state.Status) bool { return st.Phase == state.PhaseRunning })
	victim := st.Nodes[0]
	machine := strings.TrimPrefix(victim, "vdep-"+net.id+"-")
	dead := time.Now()
	if err := agents[victim].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	ipCmd(t, "link", "set", net.veth[machine], "down")
	st = waitStatus(t, ctx, root, created.ID, "no longer Running", func(st state.Status) bool { return st.Phase != state.PhaseRunning })
	lost := time.Since(dead)
	if lost > agentLeaseTTL+time.Second {
		t.Errorf("session on the dead machine %s became %s after %s; want within the lease TTL (%s) + 1s", machine, st.Phase, lost, agentLeaseTTL)
	}
	t.Logf("machine %s killed: its session %s after %s (%s)", machine, st.Phase, lost.Round(time.Millisecond), st.Reason)

	// The etcd leader and ctl-1's placer die too, while a long job runs:
	// it is not lost (etcd carries leases over to the new leader), binding
	// resumes, and jobs through ctl-2's API run on the machines left.
	// The lost session is re-queued; cancel it first, so that it takes no
	// GPUs from the jobs below.
	if code, out := runVoyager(t, ctl2, "session", "stop", created.ID); code != 0 {
		t.Fatalf("stop the lost session: exit %d\n%s", code, out)
	}
	code, out = runVoyager(t, ctl2, "session", "create", "--kind", "batch", "--gpus", "2", "-o", "json", "--", "sleep", "600")
	if err := json.Unmarshal([]byte(out), &created); code != 0 || err != nil {
		t.Fatalf("session create: exit %d (%v)\n%s", code, err, out)
	}
	long := created.ID
	waitStatus(t, ctx, root, long, "Running", func(st state.Status) bool { return st.Phase == state.PhaseRunning })
	c.silenceFollower(ctx, root, net, ms, agents, long, ctl2)
	killed := time.Now()
	leader, elected := c.killLeader(ctx)
	if err := placers["ctl-1"].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	probe := submitAfterFailover(t, ctx, root)
	waitStatus(t, ctx, root, probe, "Bound", func(st state.Status) bool { return st.Bound != nil })
	resumed := time.Since(killed)
	runJobs(t, ctl2, 2)
	if st, _, err := state.Get[state.Status](ctx, root, keys.Status(long)); err != nil || st.Phase != state.PhaseRunning {
		t.Errorf("the long job across the leader's death: %s %s (%v); want Running", st.Phase, st.Reason, err)
	}
	// Its agent stops it, so that no container outlives the test.
	if code, out := runVoyager(t, ctl2, "session", "stop", long); code != 0 {
		t.Fatalf("stop the long job: exit %d\n%s", code, out)
	}
	waitStatus(t, ctx, root, long, "Stopped", func(st state.Status) bool { return st.Phase == state.PhaseStopped })
	t.Logf("killed etcd leader %s and ctl-1's placer: new leader after %s, a session bound %s after the kills, two jobs ran to completion %s after them",
		leader, elected.Round(time.Millisecond), resumed.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
}

// silenceFollower takes an etcd follower's link down: the member sends no
// reset, so every connection to it stays open and carries nothing, as when
// its machine loses power. The components' keepalive pings close those
// connections and they carry on with the other two members; an agent's
// renewal sent on one is hedged on another. For two fence deadlines the
// long job keeps running (no agent fences) and a job runs to completion;
// then the link comes back and the member answers again.
func (c *secureCluster) silenceFollower(ctx context.Context, root *clientv3.Client, net *vnet, ms []etcdMember, agents map[string]*proc, long string, cli []string) {
	t := c.t
	t.Helper()
	leader := c.leader(ctx, root)
	var follower etcdMember
	for _, m := range ms {
		if m.name != leader {
			follower = m
			break
		}
	}
	const fenced = `msg="fenced`
	fences := map[string]int{}
	for node, a := range agents {
		fences[node] = strings.Count(a.stderr(), fenced)
	}
	silenced := time.Now()
	ipCmd(t, "link", "set", net.veth[follower.name], "down")
	runJobs(t, cli, 1)
	ran := time.Since(silenced)
	// Two fence deadlines since the link went down.
	if rest := 2*agentFenceAfter - time.Since(silenced); rest > 0 {
		time.Sleep(rest) // the span over which no agent may fence, the point of the check
	}
	if st, _, err := state.Get[state.Status](ctx, root, keys.Status(long)); err != nil || st.Phase != state.PhaseRunning || st.Attempt != 0 {
		t.Errorf("the long job with follower %s silent: %s attempt %d (%v); want Running, attempt 0", follower.name, st.Phase, st.Attempt, err)
	}
	for node, a := range agents {
		if strings.Count(a.stderr(), fenced) > fences[node] {
			t.Errorf("agent %s fenced with follower %s silent:\n%s", node, follower.name, a.stderr())
		}
	}
	ipCmd(t, "link", "set", net.veth[follower.name], "up")
	back := time.Now()
	for {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := root.Status(sctx, "https://"+follower.client)
		cancel()
		if err == nil {
			break
		}
		if time.Since(back) > 30*time.Second {
			t.Fatalf("etcd member %s does not answer 30 s after its link came back: %v", follower.name, err)
		}
		time.Sleep(100 * time.Millisecond) // polling the member, bounded above
	}
	t.Logf("etcd follower %s silent for %s: a job ran to completion %s after, the long job kept running, no agent fenced; answering again %s after its link came back",
		follower.name, back.Sub(silenced).Round(time.Millisecond), ran.Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
}

// checkRayDashboard: a Ray notebook's dashboard, published nowhere, is
// served to its owner by `voyager dashboard` on a local port, through the
// API and the agent of the head, which reaches it inside the head's
// container; another user's `voyager dashboard` is refused.
func checkRayDashboard(t *testing.T, ctx context.Context, ada []string, root *clientv3.Client) {
	t.Helper()
	code, out := runVoyager(t, ada, "session", "create", "--kind", "notebook", "--gpus", "2", "--ray-workers", "1", "-o", "json")
	var created struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(out), &created); code != 0 || err != nil || created.ID == "" {
		t.Fatalf("create a Ray notebook: exit %d (%v)\n%s", code, err, out)
	}
	id := created.ID
	waitStatus(t, ctx, root, id, "Running", func(st state.Status) bool { return st.Phase == state.PhaseRunning })
	dash := start(t, ada, "dashboard", id, "--listen", "127.0.0.1:0")
	m := regexp.MustCompile(`at (http://127\.0\.0\.1:\d+/)`).FindStringSubmatch(dash.waitFor("Ray dashboard of session "+id, 30*time.Second))
	if m == nil {
		t.Fatal("voyager dashboard printed no local URL")
	}
	hc := http.Client{Timeout: 10 * time.Second}
	for path, want := range map[string]string{"": "ray dashboard stand-in of " + id, "api/version": `"ray_version": "stand-in"`} {
		resp, err := hc.Get(m[1] + path)
		if err != nil {
			t.Fatalf("dashboard %s: %v", path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
			t.Errorf("dashboard /%s through voyager dashboard: %s %q, want 200 with %q", path, resp.Status, b, want)
		}
	}
	// Addressed by a name (DNS rebinding), the local proxy refuses.
	req, _ := http.NewRequest("GET", m[1], nil)
	req.Host = "attacker.example:80"
	if resp, err := hc.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("dashboard asked for by a name: %v %v, want 403", resp, err)
	} else {
		resp.Body.Close()
	}
	eve := slices.Clone(ada)
	for i, kv := range eve {
		if strings.HasPrefix(kv, envToken+"=") {
			eve[i] = envToken + "=" + binaryToken(t, ada, "--sub", "eve")
		}
	}
	if code, out := runVoyager(t, eve, "dashboard", id, "--listen", "127.0.0.1:0"); code == 0 || !strings.Contains(out, "no session") {
		t.Errorf("another user's voyager dashboard: exit %d, want a refusal naming no session:\n%s", code, out)
	}
	if code, out := runVoyager(t, ada, "session", "stop", id); code != 0 {
		t.Fatalf("stop the Ray notebook: exit %d\n%s", code, out)
	}
	waitStatus(t, ctx, root, id, "Stopped", func(st state.Status) bool { return st.Phase == state.PhaseStopped })
}

// submitAfterFailover creates a small batch session the way the API does,
// retrying while etcd cannot answer (its leader just died), and returns
// its id.
func submitAfterFailover(t *testing.T, ctx context.Context, cli *clientv3.Client) string {
	t.Helper()
	for {
		now := time.Now().UTC()
		id, err := state.NewSessionID(now)
		if err != nil {
			t.Fatal(err)
		}
		s := state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Desired: state.DesiredRunning, Created: now,
			Command: []string{"true"}, Resources: state.Resources{CPUMilli: 100, MemoryMiB: 64}}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = state.CreateSession(cctx, cli, keys, s, now)
		cancel()
		if err == nil {
			return id
		}
		if ctx.Err() != nil {
			t.Fatalf("create a session after the failover: %v", err)
		}
	}
}

// writeRayStandIn puts a stand-in for Ray's CLI in a user's home (bin/ray):
// `ray start --block` (a worker) blocks, any other ray command succeeds.
func writeRayStandIn(t *testing.T, home string) {
	t.Helper()
	script := "#!/bin/sh\ncase \" $* \" in *' --block '*) exec sleep 100000 ;; esac\nexit 0\n"
	if err := os.MkdirAll(filepath.Join(home, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "bin", "ray"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}

// writeRendezvous puts the test image's rendezvous stand-in (a static
// program) in a user's home (bin/rendezvous).
func writeRendezvous(t *testing.T, home string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(home, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "bin", "rendezvous"), runtimetest.RendezvousProgram(t), 0o755); err != nil {
		t.Fatal(err)
	}
}

// waitReleased waits until no binding of session id is left, at most d.
func waitReleased(t *testing.T, ctx context.Context, cli *clientv3.Client, id string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		resp, err := cli.Get(ctx, keys.AllBindings(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		var left []string
		for _, kv := range resp.Kvs {
			if _, bid, ok := keys.BindingKey(string(kv.Key)); ok && bid == id {
				left = append(left, string(kv.Key))
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %s ended but %v are still bound after %s", id, left, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
