package runtime_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
)

// ip runs iproute2 with args, failing t if it fails.
func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %v: %v: %s", args, err, out)
	}
}

// leftBridge makes the bridge of the network named name as a network on
// subnet 10.<octet>.<pid>.0/24 leaves it (its gateway address, up),
// removed when t ends. It returns the bridge's name, its hash (for other
// links' names) and that subnet.
func leftBridge(t *testing.T, name string, octet int) (br, hash, subnet string) {
	t.Helper()
	sum := sha256.Sum256([]byte(name))
	hash = hex.EncodeToString(sum[:3])
	br = "vy" + hash
	ip(t, "link", "add", br, "type", "bridge")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "delete", br).Run() })
	ip(t, "addr", "add", fmt.Sprintf("10.%d.%d.1/24", octet, os.Getpid()%256), "dev", br)
	ip(t, "link", "set", br, "up")
	return br, hash, fmt.Sprintf("10.%d.%d.0/24", octet, os.Getpid()%256)
}

// TestNetworkMovesItsIdleBridgeToANewSubnet: the bridge of a network
// whose subnet changed (its node's claim moved, or an operator set
// another) still carries the former gateway address. CNI's bridge plugin
// refuses to add a second one ("already has an IP address different
// from"), so every container would fail to start; with no container
// attached the network deletes the bridge at start, and the next
// container's setup makes it again on the new subnet. ReadBridge reports
// the bridge's subnet and its attached containers before and after.
func TestNetworkMovesItsIdleBridgeToANewSubnet(t *testing.T) {
	name := fmt.Sprintf("stale-br-%d", os.Getpid())
	_, _, former := leftBridge(t, name, 251)
	next := fmt.Sprintf("10.252.%d.0/24", os.Getpid()%256)
	opts := runtime.NetworkOptions{Mode: runtime.NetworkIsolated, Name: name, Subnet: next, StateDir: t.TempDir()}
	st, err := runtime.ReadBridge(opts)
	if err != nil || st.Subnet != former || st.Ports != 0 {
		t.Fatalf("ReadBridge before: %+v, %v; want %s with no ports", st, err, former)
	}

	rt := runtimetest.New(t, runtime.ContainerdOptions{Network: opts})
	if err := rt.Start(context.Background(), runtime.Spec{ID: "on-next", Image: runtimetest.ImageRef, Args: []string{"sleep", "60"}}); err != nil {
		t.Fatalf("start a container on the new subnet: %v", err)
	}
	st, err = runtime.ReadBridge(opts)
	if err != nil || st.Subnet != next || st.Ports != 1 {
		t.Errorf("ReadBridge after: %+v, %v; want %s with one port", st, err, next)
	}
}

// TestNetworkLeavesABusyBridgeAlone: with a container attached (here one
// end of a veth pair, as a container's host-side end is), a bridge on
// another subnet is left as it is: its containers keep their addresses.
func TestNetworkLeavesABusyBridgeAlone(t *testing.T) {
	name := fmt.Sprintf("busy-br-%d", os.Getpid())
	br, hash, former := leftBridge(t, name, 253)
	port := "vp" + hash
	ip(t, "link", "add", port, "type", "veth", "peer", "name", "vq"+hash)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "delete", port).Run() })
	ip(t, "link", "set", port, "master", br)
	opts := runtime.NetworkOptions{Mode: runtime.NetworkIsolated, Name: name, Subnet: fmt.Sprintf("10.254.%d.0/24", os.Getpid()%256), StateDir: t.TempDir()}
	runtimetest.New(t, runtime.ContainerdOptions{Network: opts})
	st, err := runtime.ReadBridge(opts)
	if err != nil || st.Subnet != former || st.Ports != 1 {
		t.Errorf("ReadBridge after the network started: %+v, %v; want %s with its one port", st, err, former)
	}
}

// masqRules are the nat POSTROUTING rules marked as network name's
// masquerade.
func masqRules(t *testing.T, name string) []string {
	t.Helper()
	out, err := exec.Command("iptables", "-t", "nat", "-S", "POSTROUTING").CombinedOutput()
	if err != nil {
		t.Fatalf("iptables -t nat -S POSTROUTING: %v: %s", err, out)
	}
	var rules []string
	for _, line := range strings.Split(string(out), "\n") {
		if slices.Contains(strings.Fields(line), "voyager-"+name) {
			rules = append(rules, line)
		}
	}
	return rules
}

// TestNetworkMasqueradeFollowsItsSubnet: a network set up again on another
// subnet keeps one masquerade, the new subnet's, and a network removed as
// a sweep removes it (by the owner record's name and state directory,
// which do not hold the subnet an agent was configured with) leaves none:
// before, a test agent's VOYAGER_AGENT_NETWORK_SUBNET masquerade outlived
// every passing run.
func TestNetworkMasqueradeFollowsItsSubnet(t *testing.T) {
	name := fmt.Sprintf("masq-%d", os.Getpid())
	dir := t.TempDir()
	subnet := func(octet int) string { return fmt.Sprintf("10.%d.%d.0/24", octet, os.Getpid()%256) }
	first := runtime.NetworkOptions{Mode: runtime.NetworkIsolated, Name: name, Subnet: subnet(248), StateDir: dir}
	a, err := runtime.NewContainerd(context.Background(), runtime.ContainerdOptions{Address: runtimetest.Address(t), Namespace: name, Network: first})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	t.Cleanup(func() { _ = runtime.RemoveNetwork(context.Background(), first, nil) })
	if got := masqRules(t, name); len(got) != 1 || !strings.Contains(got[0], subnet(248)) {
		t.Fatalf("masquerades after the first setup: %q, want one for %s", got, subnet(248))
	}

	second := first
	second.Subnet = subnet(247)
	b, err := runtime.NewContainerd(context.Background(), runtime.ContainerdOptions{Address: runtimetest.Address(t), Namespace: name, Network: second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if got := masqRules(t, name); len(got) != 1 || !strings.Contains(got[0], subnet(247)) {
		t.Fatalf("masquerades after the setup on another subnet: %q, want one, for %s", got, subnet(247))
	}

	if err := runtime.RemoveNetwork(context.Background(), runtime.NetworkOptions{Mode: runtime.NetworkIsolated, Name: name, StateDir: dir}, nil); err != nil {
		t.Fatal(err)
	}
	if got := masqRules(t, name); len(got) != 0 {
		t.Errorf("masquerades left by a removal that did not name the subnet: %q", got)
	}
}
