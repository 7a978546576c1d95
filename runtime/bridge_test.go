package runtime_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
)

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
	sum := sha256.Sum256([]byte(name))
	br := "vy" + hex.EncodeToString(sum[:3])
	former := fmt.Sprintf("10.251.%d.0/24", os.Getpid()%256)
	next := fmt.Sprintf("10.252.%d.0/24", os.Getpid()%256)
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	// The bridge as a network on the former subnet left it.
	ip("link", "add", br, "type", "bridge")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "delete", br).Run() })
	ip("addr", "add", fmt.Sprintf("10.251.%d.1/24", os.Getpid()%256), "dev", br)
	ip("link", "set", br, "up")
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

// TestNetworkLeavesABusyBridgeAlone: with a container attached (here one end of a
// veth pair, as a container's host-side end is), a bridge on another
// subnet is left as it is: its containers keep their addresses.
func TestNetworkLeavesABusyBridgeAlone(t *testing.T) {
	name := fmt.Sprintf("busy-br-%d", os.Getpid())
	sum := sha256.Sum256([]byte(name))
	br, port, peer := "vy"+hex.EncodeToString(sum[:3]), "vp"+hex.EncodeToString(sum[:3]), "vq"+hex.EncodeToString(sum[:3])
	former := fmt.Sprintf("10.253.%d.0/24", os.Getpid()%256)
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	ip("link", "add", br, "type", "bridge")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "delete", br).Run() })
	ip("link", "add", port, "type", "veth", "peer", "name", peer)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "delete", port).Run() })
	ip("link", "set", port, "master", br)
	ip("addr", "add", fmt.Sprintf("10.253.%d.1/24", os.Getpid()%256), "dev", br)
	opts := runtime.NetworkOptions{Mode: runtime.NetworkIsolated, Name: name, Subnet: fmt.Sprintf("10.254.%d.0/24", os.Getpid()%256), StateDir: t.TempDir()}
	runtimetest.New(t, runtime.ContainerdOptions{Network: opts})
	st, err := runtime.ReadBridge(opts)
	if err != nil || st.Subnet != former || st.Ports != 1 {
		t.Errorf("ReadBridge after the network started: %+v, %v; want %s with its one port", st, err, former)
	}
}
