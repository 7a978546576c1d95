package nodeagent_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
	"github.com/voyager-gpu/voyager/state"
)

// attack is one attempt from inside a tenant's container: a shell snippet
// whose output (stdout and stderr) the test judges with hit.
type attack struct {
	name   string
	script string
	hit    func(out string) bool
}

func contains(s string) func(string) bool {
	return func(out string) bool { return strings.Contains(out, s) }
}

// attackScript runs every attack and prints, for each, one line:
// ATTACK <name> <base64 of its output>.
func attackScript(attacks []attack) string {
	var b strings.Builder
	for _, a := range attacks {
		fmt.Fprintf(&b, "o=$( { %s ; } 2>&1 | head -c 65536 | base64 -w 0); echo \"ATTACK %s $o\"\n", a.script, a.name)
	}
	return b.String()
}

// etcdHasToken reports whether an etcd gateway range answer holds token.
func etcdHasToken(token string) func(string) bool {
	return func(out string) bool {
		var resp struct {
			Kvs []struct{ Value string } `json:"kvs"`
		}
		if json.Unmarshal([]byte(out), &resp) != nil {
			return false
		}
		for _, kv := range resp.Kvs {
			if v, err := base64.StdEncoding.DecodeString(kv.Value); err == nil && strings.Contains(string(v), token) {
				return true
			}
		}
		return false
	}
}

// runAttacks starts, on real containerd with the network mode given, an
// agent with etcd and its log endpoint on the node's address, a stand-in
// API on loopback, a victim's notebook with a Ray head (bob), and then a
// batch session of another tenant (eve) that tries every attack. It
// returns which attacks succeeded, by name.
func runAttacks(t *testing.T, mode string) map[string]bool {
	addr := runtimetest.MachineAddr(t)
	etcd := etcdtest.Start(t, etcdtest.Options{ClientAddr: net.JoinHostPort(addr, strconv.Itoa(freePort(t)))})
	cli := etcd.Client(t)
	etcdURL := etcd.Server.Endpoint()

	ports := []int{freePort(t), freePort(t), freePort(t), freePort(t)}
	sort.Ints(ports)
	rt := runtimetest.New(t, runtime.ContainerdOptions{Network: runtime.NetworkOptions{
		Mode: mode, Name: fmt.Sprintf("isolation-atk-%d", os.Getpid()), StateDir: t.TempDir(),
		BlockedPorts: [2]int{ports[0], ports[len(ports)-1]},
	}})
	cfg := testConfig(t, cli, rt)
	cfg.Image, cfg.Address = runtimetest.ImageRef, addr

	// The agent's log endpoint, on every address as `voyager agent` serves it.
	logL, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	logPort := logL.Addr().(*net.TCPAddr).Port
	cfg.LogsBaseURL = fmt.Sprintf("http://%s:%d", addr, logPort)
	a, _ := runAgent(t, cfg)
	mux := http.NewServeMux()
	mux.Handle(nodeagent.LogsPath, a.LogsHandler())
	mux.Handle(nodeagent.DashboardPath, a.DashboardHandler())
	logSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = logSrv.Serve(logL) }()
	t.Cleanup(func() { _ = logSrv.Close() })

	// The API's loopback listener (voyager dev's default 127.0.0.1:7070).
	apiL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	api := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "voyager-api-answered")
	})}
	go func() { _ = api.Serve(apiL) }()
	t.Cleanup(func() { _ = api.Close() })

	// The victim: bob's notebook with a Ray head, a secret in its log and
	// in its home.
	secretHome := filepath.Join(cfg.HomeDir, "bob")
	uids := map[string]uint32{}
	for _, owner := range []string{"bob", "eve"} {
		u, err := state.EnsureUID(context.Background(), cli, keys, owner, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		uids[owner] = u
	}
	bobUID, eveUID := uids["bob"], uids["eve"]
	victim := bind(t, cli, state.Session{ID: "victim", Owner: "bob", UID: &bobUID, Kind: state.KindNotebook, Ray: &state.Ray{},
		Command: []string{"sh", "-c", "echo bob-private > $HOME/secret; echo bob-log-line; exec jupyter --port=$PORT"}},
		state.Binding{Role: state.RoleHead, CPUMilli: 200, MemoryMiB: 128, Ports: ports})
	waitPhase(t, cli, "victim", state.PhaseRunning, 60*time.Second)
	u := secretURL(t, cli, "victim", "jupyter")
	token := u[strings.Index(u, "token=")+len("token="):]
	if len(token) < 32 {
		t.Fatalf("victim's Jupyter URL %q has no token", u)
	}
	logsURL := secretURL(t, cli, "victim", "logs")
	// bob's home is his alone, by file permissions as well as by mounts.
	if fi, err := os.Stat(secretHome); err != nil {
		t.Fatal(err)
	} else if st := fi.Sys().(*syscall.Stat_t); st.Uid != bobUID || fi.Mode().Perm() != 0o700 {
		t.Errorf("bob's home: uid %d, mode %v; want uid %d, 0700", st.Uid, fi.Mode().Perm(), bobUID)
	}
	vin, err := rt.Status(context.Background(), nodeagent.ContainerID(victim))
	if err != nil {
		t.Fatal(err)
	}
	jup, gcs, dash, client := strconv.Itoa(ports[0]), strconv.Itoa(ports[1]), strconv.Itoa(ports[2]), strconv.Itoa(ports[3])
	// The dashboard through the agent without the key: the log URL's
	// path under the dashboard's route.
	dashNoKey := strings.Replace(strings.Split(logsURL, "?")[0], nodeagent.LogsPath, nodeagent.DashboardPath, 1) + "/"
	// The attacker knows addresses and ports (they are no secret), never
	// the victim's token: the script must not hold it.
	get := func(url string) string { return "timeout 3 wget -q -O - '" + url + "'" }

	attacks := []attack{
		{"etcd-client-port", get(etcdURL + "/version"), contains("etcdserver")},
		{"etcd-gateway-read-all", "timeout 3 wget -q -O - --post-data '{\"key\":\"AA==\",\"range_end\":\"AA==\"}' " + etcdURL + "/v3/kv/range", contains("\"kvs\"")},
		{"etcd-token", "timeout 3 wget -q -O - --post-data '{\"key\":\"AA==\",\"range_end\":\"AA==\"}' " + etcdURL + "/v3/kv/range", etcdHasToken(token)},
		{"agent-logs-node-address", get(logsURL), contains("bob-log-line")},
		{"agent-logs-loopback", get(strings.Replace(logsURL, addr, "127.0.0.1", 1)), contains("bob-log-line")},
		{"api-loopback", get("http://" + apiL.Addr().String() + "/"), contains("voyager-api-answered")},
		{"containerd-socket", "test -S " + runtimetest.Address(t) + " && echo socket-present; test -S /run/containerd/containerd.sock && echo socket-present", contains("socket-present")},
		{"jupyter-published-port", get("http://" + addr + ":" + jup + "/"), contains("Voyager session victim")},
		{"jupyter-loopback", get("http://127.0.0.1:" + jup + "/"), contains("Voyager session victim")},
		{"ray-gcs-node-address", get("http://" + addr + ":" + gcs + "/"), contains("ray head")},
		{"ray-client-node-address", get("http://" + addr + ":" + client + "/"), contains("ray head")},
		{"ray-gcs-loopback", get("http://127.0.0.1:" + gcs + "/"), contains("ray head")},
		{"ray-dashboard-node-address", get("http://" + addr + ":" + dash + "/"), contains("ray dashboard stand-in")},
		{"ray-dashboard-loopback", get("http://127.0.0.1:" + dash + "/"), contains("ray dashboard stand-in")},
		{"ray-dashboard-agent-without-key", get(dashNoKey), contains("ray dashboard stand-in")},
		{"home-of-another-user", "cat " + secretHome + "/secret /home/bob/secret /home/jovyan/../bob/secret", contains("bob-private")},
		{"token-in-env-or-proc", "env; cat /proc/*/environ; ps -o args", contains(token)},
		{"run-as-victims-uid", "id -u", contains(strconv.FormatUint(uint64(bobUID), 10))},
	}
	if vin.IP != "" {
		attacks = append(attacks,
			attack{"jupyter-container-address", get("http://" + vin.IP + ":" + jup + "/"), contains("Voyager session victim")},
			attack{"ray-gcs-container-address", get("http://" + vin.IP + ":" + gcs + "/"), contains("ray head")},
			attack{"ray-dashboard-container-address", get("http://" + vin.IP + ":" + dash + "/"), contains("ray dashboard stand-in")})
	}

	// The attacker: eve's batch session.
	if script := attackScript(attacks); strings.Contains(script, token) {
		t.Fatal("the attack script holds the victim's token")
	}
	bind(t, cli, state.Session{ID: "attacker", Owner: "eve", UID: &eveUID, Kind: state.KindBatch, Command: []string{"sh", "-c", attackScript(attacks)}},
		state.Binding{CPUMilli: 200, MemoryMiB: 64})
	waitPhase(t, cli, "attacker", state.PhaseSucceeded, 120*time.Second)
	logs, _ := filepath.Glob(filepath.Join(cfg.LogDir, "attacker-q*.log"))
	if len(logs) != 1 {
		t.Fatalf("attacker's log files: %v", logs)
	}
	// The shim may copy the last output to the log a moment after the exit.
	var out []byte
	waitFor(t, "every attack reported in the log", 10*time.Second, func() (bool, string) {
		out, _ = os.ReadFile(logs[0])
		return strings.Count(string(out), "ATTACK ") >= len(attacks), string(out)
	})
	got := map[string]bool{}
	seen := 0
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "ATTACK" {
			continue
		}
		var text []byte
		if len(f) == 3 {
			text, _ = base64.StdEncoding.DecodeString(f[2])
		}
		for _, at := range attacks {
			if at.name == f[1] {
				seen++
				got[at.name] = at.hit(string(text))
				t.Logf("%-28s %-9s %.120q", at.name, map[bool]string{true: "SUCCEEDED", false: "failed"}[got[at.name]], text)
			}
		}
	}
	if seen != len(attacks) {
		t.Fatalf("the attacker reported %d of %d attacks:\n%s", seen, len(attacks), out)
	}
	return got
}

// TestTenantIsolationAttackSuite tries, from inside a real session
// container, what a hostile tenant would: reach etcd, the agent, the API,
// containerd, another session's Jupyter and Ray ports and home, and read
// its token. With isolated networking every attempt fails; with the
// host's network (isolation off) some succeed, which shows the suite can
// tell.
func TestTenantIsolationAttackSuite(t *testing.T) {
	t.Run("isolated", func(t *testing.T) {
		for name, hit := range runAttacks(t, runtime.NetworkIsolated) {
			if hit {
				t.Errorf("attack %s succeeded from an isolated session", name)
			}
		}
	})
	t.Run("host network", func(t *testing.T) {
		got := runAttacks(t, runtime.NetworkHost)
		// On the host's network a tenant reads every key of etcd, the
		// victim's token among them, and reaches its Jupyter and Ray.
		for _, name := range []string{"etcd-gateway-read-all", "etcd-token", "agent-logs-node-address", "api-loopback", "jupyter-loopback", "ray-gcs-loopback", "ray-dashboard-loopback"} {
			if !got[name] {
				t.Errorf("with isolation off, attack %s failed: the suite cannot tell isolation from none", name)
			}
		}
		// The agent's dashboard proxy wants the key on any network.
		if got["ray-dashboard-agent-without-key"] {
			t.Error("the agent served the Ray dashboard without its key")
		}
	})
}
