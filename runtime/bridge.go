package runtime

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// BridgeState is what the bridge of an isolated network carries now.
type BridgeState struct {
	// Subnet is the network of the bridge's IPv4 address (its gateway's),
	// "" when the bridge does not exist or has none.
	Subnet string
	// Ports counts the interfaces attached to it: the host-side ends of
	// containers' networks.
	Ports int
}

// networkID is the short hash of the network named name that its bridge
// ("vy" + id) and firewall chains ("VY" + id + "-…") are named after.
func networkID(name string) string {
	sum := sha256.Sum256([]byte(name))
	return hex.EncodeToString(sum[:3])
}

// ipamDir is where host-local keeps the network's address records.
func (n *cniNetwork) ipamDir() string {
	return filepath.Join("/var/lib/cni/networks", "voyager-"+n.opts.Name)
}

// ReadBridge reads the bridge of the isolated network opts.Name in
// opts.HostNetNS (empty: this process's network namespace). A bridge that
// does not exist reads as the zero state.
func ReadBridge(opts NetworkOptions) (BridgeState, error) {
	n := &cniNetwork{opts: opts, bridge: "vy" + networkID(opts.Name)}
	var st BridgeState
	err := n.inHost(func() error {
		var err error
		st, err = readBridgeHere(n.bridge)
		return err
	})
	return st, err
}

// readBridgeHere reads bridge br in the calling thread's namespace, with
// iproute2's JSON output.
func readBridgeHere(br string) (BridgeState, error) {
	if _, err := net.InterfaceByName(br); err != nil {
		return BridgeState{}, nil // no such bridge
	}
	out, err := exec.Command("ip", "-j", "-4", "addr", "show", "dev", br).Output()
	if err != nil {
		return BridgeState{}, fmt.Errorf("read bridge %s: %w", br, err)
	}
	var addrs []struct {
		AddrInfo []struct {
			Local     string `json:"local"`
			PrefixLen int    `json:"prefixlen"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal(out, &addrs); err != nil {
		return BridgeState{}, fmt.Errorf("read bridge %s: %w", br, err)
	}
	var st BridgeState
	for _, a := range addrs {
		for _, ai := range a.AddrInfo {
			if _, sub, err := net.ParseCIDR(fmt.Sprintf("%s/%d", ai.Local, ai.PrefixLen)); err == nil && st.Subnet == "" {
				st.Subnet = sub.String()
			}
		}
	}
	out, err = exec.Command("ip", "-j", "link", "show", "master", br).Output()
	if err != nil {
		return BridgeState{}, fmt.Errorf("read ports of bridge %s: %w", br, err)
	}
	var ports []json.RawMessage
	if s := strings.TrimSpace(string(out)); s != "" {
		if err := json.Unmarshal([]byte(s), &ports); err != nil {
			return BridgeState{}, fmt.Errorf("read ports of bridge %s: %w", br, err)
		}
	}
	st.Ports = len(ports)
	return st, nil
}

// resetStaleBridge deletes the network's bridge, and its address records,
// when it carries another subnet than the network's and no container is
// attached to it: CNI's bridge plugin refuses to add a second gateway
// address to a bridge ("already has an IP address different from"), so
// every container of a network whose subnet changed (its node's claim
// moved, or an operator set another) would fail to start. The plugin
// makes the bridge again at the next container's setup. With containers
// attached it is left alone, and logged: they keep their addresses.
func (n *cniNetwork) resetStaleBridge() error {
	st, err := readBridgeHere(n.bridge)
	if err != nil || st.Subnet == "" {
		return err
	}
	_, want, err := net.ParseCIDR(n.opts.Subnet)
	if err != nil || want.String() == st.Subnet {
		return err
	}
	if st.Ports > 0 {
		n.log.Warn("the network's bridge carries another subnet and containers are attached to it: new containers fail to start until they are gone",
			"bridge", n.bridge, "bridgeSubnet", st.Subnet, "subnet", n.opts.Subnet, "ports", st.Ports)
		return nil
	}
	if out, err := exec.Command("ip", "link", "delete", n.bridge).CombinedOutput(); err != nil {
		return fmt.Errorf("set up network: delete bridge %s of subnet %s: %w: %s", n.bridge, st.Subnet, err, out)
	}
	n.log.Info("deleted the network's bridge of its former subnet", "bridge", n.bridge, "from", st.Subnet, "to", n.opts.Subnet)
	return os.RemoveAll(n.ipamDir())
}
