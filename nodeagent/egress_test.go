package nodeagent_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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

// TestDeniedEgressReachesOnlyWhatItAllows: on a machine of its own (a
// network namespace with its own address), a session whose egress is
// denied reaches neither the world outside nor a second outside server,
// unless its allow list names that server; a session without the rule
// reaches both (so the probe can succeed); and a denied notebook still
// answers its user on its published Jupyter port, replies flowing out.
func TestDeniedEgressReachesOnlyWhatItAllows(t *testing.T) {
	cli := etcdtest.New(t)
	m := machines(t, 1)[0]
	const first, last = 46000, 46099
	rt := runtimetest.New(t, runtime.ContainerdOptions{Network: runtime.NetworkOptions{
		Mode: runtime.NetworkIsolated, Name: fmt.Sprintf("egress-%d", os.Getpid()), StateDir: t.TempDir(),
		HostNetNS: m.netns, BlockedPorts: [2]int{first, last},
	}})
	cfg := testConfig(t, cli, rt)
	cfg.Node, cfg.Address, cfg.ProbeHost, cfg.Image = m.name, m.addr, m.addr, runtimetest.ImageRef
	cfg.Ports = state.PortRange{First: first, Last: last}
	runAgent(t, cfg)
	waitFor(t, "the machine registered", 20*time.Second, func() (bool, string) {
		r, _ := cli.Get(context.Background(), keys.Node(m.name), clientv3.WithCountOnly())
		return r != nil && r.Count == 1, ""
	})

	// Two servers outside the machine, on two addresses of this host on
	// the machines' network: its own (.1) and one more (.2).
	net3 := m.addr[:strings.LastIndexByte(m.addr, '.')]
	out, err := exec.Command("ip", "-o", "-4", "addr", "show", "to", net3+".1/32").Output()
	if err != nil || len(strings.Fields(string(out))) < 2 {
		t.Fatalf("find the machines' bridge: %v: %s", err, out)
	}
	ipCmd(t, "addr", "add", net3+".2/24", "dev", strings.Fields(string(out))[1])
	mirror, other := serveOutside(t, net3+".1", "mirror"), serveOutside(t, net3+".2", "other")
	probe := ""
	for name, addr := range map[string]string{"mirror": mirror, "other": other} {
		probe += fmt.Sprintf("if timeout 3 wget -q -O - http://%s/ >/dev/null 2>&1; then echo REACHED %s; else echo REFUSED %s; fi; ", addr, name, name)
	}
	probe += "echo PROBED"

	run := func(id string, egress *state.Egress) string {
		t.Helper()
		parts := bindParts(t, cli, state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Command: []string{"sh", "-c", probe}, Egress: egress},
			[]state.Binding{{Node: m.name, Role: state.RoleSingle, CPUMilli: 100, MemoryMiB: 64}})
		waitPhase(t, cli, id, state.PhaseSucceeded, 60*time.Second)
		var out []byte
		waitFor(t, id+"'s probe to report in its log", 10*time.Second, func() (bool, string) { // the shim may copy it a moment after the exit
			out, _ = os.ReadFile(filepath.Join(cfg.LogDir, nodeagent.ContainerID(parts[0])+".log"))
			return strings.Contains(string(out), "PROBED"), string(out)
		})
		return string(out)
	}
	reached := func(out, name string) bool { return strings.Contains(out, "REACHED "+name) }

	if out := run("open", nil); !reached(out, "mirror") || !reached(out, "other") {
		t.Errorf("a session without an egress rule must reach both servers:\n%s", out)
	}
	if out := run("sealed", &state.Egress{Deny: true}); reached(out, "mirror") || reached(out, "other") || strings.Count(out, "REFUSED") != 2 {
		t.Errorf("a denied session reached the outside:\n%s", out)
	}
	mirrorNet := strings.Split(mirror, ":")[0] + "/32"
	if out := run("mirrored", &state.Egress{Deny: true, Allow: []string{mirrorNet}}); !reached(out, "mirror") || reached(out, "other") {
		t.Errorf("a session allowed %s must reach the mirror and nothing else:\n%s", mirrorNet, out)
	}

	// A denied notebook answers its user: the replies of its published
	// Jupyter port leave it.
	bindParts(t, cli, state.Session{ID: "sealed-nb", Owner: "ada", Kind: state.KindNotebook, Egress: &state.Egress{Deny: true}},
		[]state.Binding{{Node: m.name, Role: state.RoleSingle, CPUMilli: 100, MemoryMiB: 64, Ports: []int{46050}}})
	waitPhase(t, cli, "sealed-nb", state.PhaseRunning, 60*time.Second)
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get("http://" + m.addr + ":46050/")
	if err != nil {
		t.Fatalf("Jupyter of a denied notebook from outside: %v", err)
	}
	resp.Body.Close()
}
