package runtime_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"

	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
)

// isolatedRuntime is a runtime whose containers get their own network, on
// a bridge of a name no other test process uses.
func isolatedRuntime(t *testing.T, blocked [2]int) *runtime.Containerd {
	t.Helper()
	return runtimetest.New(t, runtime.ContainerdOptions{Network: runtime.NetworkOptions{
		Mode: runtime.NetworkIsolated, Name: fmt.Sprintf("isolation-rt-%d", os.Getpid()),
		StateDir: t.TempDir(), BlockedPorts: blocked,
	}})
}

// serve starts a container whose httpd answers on port, published.
func serve(t *testing.T, rt runtime.Runtime, id string, port int) runtime.Info {
	t.Helper()
	ctx := context.Background()
	err := rt.Start(ctx, runtime.Spec{ID: id, Image: runtimetest.ImageRef,
		Args:    []string{"sh", "-c", fmt.Sprintf("echo %s > /tmp/index.html && exec httpd -f -p %d -h /tmp", id, port)},
		Publish: []runtime.Published{{Port: port}}})
	if err != nil {
		t.Fatal(err)
	}
	in, err := rt.Status(ctx, id)
	if err != nil || in.IP == "" {
		t.Fatalf("Status(%s) = %+v, %v; want an address", id, in, err)
	}
	return in
}

// get fetches url from the host until it answers (20s at most).
func get(t *testing.T, url string) string {
	t.Helper()
	c := http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := c.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return strings.TrimSpace(string(b))
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %v", url, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestIsolatedNetworkPublishesOnlyWhatIsAsked(t *testing.T) {
	pa, pb := freePort(t), freePort(t)
	rt := isolatedRuntime(t, [2]int{min(pa, pb), max(pa, pb)})
	a := serve(t, rt, "net-a", pa)
	b := serve(t, rt, "net-b", pb)
	if a.IP == b.IP {
		t.Fatalf("two containers share address %s", a.IP)
	}
	// Published: reachable on the host's loopback and its own address.
	if got := get(t, fmt.Sprintf("http://127.0.0.1:%d/", pa)); got != "net-a" {
		t.Fatalf("published port of net-a answers %q", got)
	}
	node := runtimetest.MachineAddr(t)
	if got := get(t, fmt.Sprintf("http://%s:%d/", node, pb)); got != "net-b" {
		t.Fatalf("published port of net-b on %s answers %q", node, got)
	}

	// A host listener on every address, as etcd or the agent would be.
	l, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprint(c, "HTTP/1.0 200 OK\r\n\r\nhost-secret\n")
			c.Close()
		}
	}()
	hostPort := l.Addr().(*net.TCPAddr).Port
	gw := a.IP[:strings.LastIndexByte(a.IP, '.')] + ".1"

	// From inside net-b: nothing but the outside world.
	script := ""
	for _, target := range []string{
		fmt.Sprintf("%s:%d", a.IP, pa),       // another container, directly
		fmt.Sprintf("%s:%d", node, pa),       // another container's published port
		fmt.Sprintf("%s:%d", gw, hostPort),   // the host, through the gateway
		fmt.Sprintf("%s:%d", node, hostPort), // the host, at its own address
	} {
		script += fmt.Sprintf("if timeout 3 wget -q -O - http://%s/ >/dev/null 2>&1; then echo REACHED %s; else echo REFUSED %s; fi; ", target, target, target)
	}
	logPath := filepath.Join(t.TempDir(), "probe.log")
	code, out := runBatch(t, rt, runtime.Spec{ID: "net-probe", Image: runtimetest.ImageRef, Args: []string{"sh", "-c", script}, LogPath: logPath})
	if code != 0 {
		t.Fatalf("probe exited %d:\n%s", code, out)
	}
	// The shim may copy the last output to the log a moment after the exit.
	for deadline := time.Now().Add(10 * time.Second); strings.Count(out, "\n") < 4 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		b, _ := os.ReadFile(logPath)
		out = string(b)
	}
	if strings.Contains(out, "REACHED") || strings.Count(out, "REFUSED") != 4 {
		t.Fatalf("a container reached what it must not:\n%s", out)
	}
}

// TestIsolatedNetworkCollectsGoneContainers: a container removed behind
// the runtime's back leaves its published port's NAT rule; the next
// runtime over the namespace tears it down, so the port serves a new
// container.
func TestIsolatedNetworkCollectsGoneContainers(t *testing.T) {
	port := freePort(t)
	opts := runtime.ContainerdOptions{Network: runtime.NetworkOptions{
		Mode: runtime.NetworkIsolated, Name: fmt.Sprintf("isolation-gc-%d", os.Getpid()), StateDir: t.TempDir(),
	}}
	rt := runtimetest.New(t, opts)
	serve(t, rt, "gone", port)
	if got := get(t, fmt.Sprintf("http://127.0.0.1:%d/", port)); got != "gone" {
		t.Fatalf("published port answers %q", got)
	}
	// Behind the runtime's back: containerd's own client deletes it.
	ctx := namespaces.WithNamespace(context.Background(), rt.Namespace())
	cli, err := containerd.New(rt.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	cont, err := cli.LoadContainer(ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	if task, err := cont.Task(ctx, nil); err == nil {
		_, _ = task.Delete(ctx, containerd.WithProcessKill)
	}
	if err := cont.Delete(ctx, containerd.WithSnapshotCleanup); err != nil {
		t.Fatal(err)
	}
	natHas := func() bool {
		out, _ := exec.Command("iptables", "-t", "nat", "-S").CombinedOutput()
		return strings.Contains(string(out), fmt.Sprintf("--dport %d ", port))
	}
	if !natHas() {
		t.Fatal("no NAT rule for the published port after a removal behind the runtime's back: nothing to collect, the test cannot tell")
	}
	opts.Namespace, opts.Address = rt.Namespace(), rt.Address()
	again, err := runtime.NewContainerd(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if natHas() {
		t.Fatal("the NAT rule of a gone container survived a new runtime")
	}
	serve(t, again, "next", port)
	if got := get(t, fmt.Sprintf("http://127.0.0.1:%d/", port)); got != "next" {
		t.Fatalf("the port serves %q; want the new container", got)
	}
	if err := again.Remove(context.Background(), "next"); err != nil {
		t.Fatal(err)
	}
}

// TestMeshRefusesBadPeersAndCleansUp: a container's mesh hook gets the
// container's own address before its process runs; a peer whose node
// shares this node's container subnet fails the start, saying what to
// change, and leaves no container; a good mesh's nat chain goes with its
// container.
func TestMeshRefusesBadPeersAndCleansUp(t *testing.T) {
	rt := isolatedRuntime(t, [2]int{})
	ctx := context.Background()
	sub := rt.Subnet()
	var got string
	err := rt.Start(ctx, runtime.Spec{ID: "mesh-overlap", Image: runtimetest.ImageRef, Args: []string{"sleep", "60"},
		Mesh: func(_ context.Context, addr string) ([]runtime.MeshPeer, error) {
			got = addr
			return []runtime.MeshPeer{{Addr: strings.TrimSuffix(sub, ".0/24") + ".77", Subnet: sub}}, nil
		}})
	if err == nil || !strings.Contains(err.Error(), "VOYAGER_AGENT_NETWORK_SUBNET") {
		t.Fatalf("Start with a peer on this node's subnet: %v, want a refusal naming VOYAGER_AGENT_NETWORK_SUBNET", err)
	}
	if _, _, perr := net.ParseCIDR(sub); perr != nil || got == "" || !strings.HasPrefix(got, strings.TrimSuffix(sub, "0/24")) {
		t.Errorf("the mesh hook got address %q, want one in %s", got, sub)
	}
	if _, err := rt.Status(ctx, "mesh-overlap"); err == nil {
		t.Error("a refused start left its container")
	}

	// A good mesh (a peer in another subnet, routed by the fabric): its
	// container's nat chain exempts the peer from the masquerade, and
	// goes with the container.
	err = rt.Start(ctx, runtime.Spec{ID: "mesh-good", Image: runtimetest.ImageRef, Args: []string{"sleep", "60"},
		Mesh: func(context.Context, string) ([]runtime.MeshPeer, error) {
			return []runtime.MeshPeer{{Addr: "10.250.9.7", Subnet: "10.250.9.0/24"}}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	nat := func() string {
		out, err := exec.Command("iptables-save", "-t", "nat").CombinedOutput()
		if err != nil {
			t.Fatalf("iptables-save: %v: %s", err, out)
		}
		return string(out)
	}
	in, _ := rt.Status(ctx, "mesh-good")
	if rule := "-s " + in.IP + "/32 -d 10.250.9.7/32 -j ACCEPT"; !strings.Contains(nat(), rule) {
		t.Errorf("nat table lacks the mesh exemption %q", rule)
	}
	if err := rt.Remove(ctx, "mesh-good"); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(nat(), "10.250.9.7") {
		t.Errorf("the mesh exemption outlived its container:\n%s", nat())
	}
}
