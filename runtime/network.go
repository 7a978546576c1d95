package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/pkg/netns"
	gocni "github.com/containerd/go-cni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/coreos/go-iptables/iptables"
)

// Network modes of a Containerd.
const (
	// NetworkHost runs containers in the host's network namespace: they
	// reach everything the host reaches, every host listener included.
	// For debugging only.
	NetworkHost = "host"
	// NetworkIsolated gives every container its own network namespace on
	// the instance's bridge, set up by CNI, with the firewall rules of
	// docs/networking.md.
	NetworkIsolated = "isolated"
)

// DefaultCNIPluginDirs are where the CNI plugins are looked for: Debian's
// containernetworking-plugins, then the upstream location.
var DefaultCNIPluginDirs = []string{"/usr/lib/cni", "/opt/cni/bin"}

// defaultPath is the PATH the CNI plugins get when the process has none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// NetworkOptions configure the containers' network. The zero value is the
// host's network.
type NetworkOptions struct {
	// Mode is NetworkHost (the default) or NetworkIsolated.
	Mode string
	// Name tells this instance's network apart from others on the machine:
	// its bridge, subnet (unless Subnet is set), CNI network and firewall
	// chains derive from it. Letters, digits, '-' and '_'.
	Name string
	// Subnet is the IPv4 CIDR the containers' addresses come from.
	// Default: a /24 in 10.128.0.0/10 derived from Name.
	Subnet string
	// PluginDirs are searched for the CNI plugins (bridge, host-local,
	// portmap, firewall, loopback). Default DefaultCNIPluginDirs.
	PluginDirs []string
	// StateDir holds the containers' network namespaces. Default
	// /run/voyager/net/<Name>.
	StateDir string
	// BlockedPorts is a range of ports (first, last) that containers may
	// not reach anywhere, except the endpoints their Spec.Reach names:
	// the node port range, where every node publishes sessions' ports.
	// Zero: none.
	BlockedPorts [2]int
	// DenyCIDRs are networks containers may not reach at all (the control
	// plane's, the cloud metadata service's).
	DenyCIDRs []string
	// HostNetNS is the network namespace that stands for the machine: its
	// bridge, firewall and published ports live there. Empty: this
	// process's (the machine's own). Tests set it to run several
	// "machines" on one host.
	HostNetNS string
	// Allow are endpoints every container may reach although the rules
	// above refuse them: a JupyterHub's API on this machine or on a
	// denied network, which single-user servers call back. IP addresses.
	Allow []Endpoint
}

// Published is a container port reachable from outside the node, on every
// address of the node, at the same port number.
type Published struct {
	Port int
	// From are the CIDRs allowed to connect; empty: anyone.
	From []string
}

// Endpoint is an address and ports a container may reach although the
// network blocks them (BlockedPorts): a Ray worker's head.
type Endpoint struct {
	Addr  string
	Ports []int
}

// Labels a Containerd keeps with an isolated container, to tear its
// network down after a restart.
const (
	labelNetNS   = "voyager.runtime/netns"
	labelPublish = "voyager.runtime/publish"
	labelIP      = "voyager.runtime/ip"
)

// cniNetwork is an isolated network of one Containerd instance: a CNI
// bridge network plus the firewall chains around it.
type cniNetwork struct {
	opts   NetworkOptions
	id     string // short hash of Name: chain names
	bridge string
	fwd    string // the firewall plugin's admin chain: FORWARD rules
	in     string // INPUT rules: nothing of the host is reachable
	ses    string // jumps to the per-container chains
	nat    string // nat: jumps to the per-container nat chains (mesh)
	cni    gocni.CNI
	ipt    *iptables.IPTables
	log    *slog.Logger
}

// newCNINetwork loads the CNI configuration and installs the instance's
// firewall chains. It fails when a plugin is missing.
func newCNINetwork(opts NetworkOptions, log *slog.Logger) (*cniNetwork, error) {
	n, err := openCNINetwork(opts, log)
	if err != nil {
		return nil, err
	}
	if err := n.inHost(n.resetStaleBridge); err != nil {
		return nil, err
	}
	if err := n.inHost(n.installChains); err != nil {
		return nil, err
	}
	// Recorded so that a sweep can remove what a killed process left
	// (internal/hostclean, make clean-host); the network works without it.
	if err := RecordOwner(Owner{Kind: "network", Name: opts.Name, StateDir: n.opts.StateDir, HostNetNS: opts.HostNetNS}); err != nil {
		log.Debug("record the network's owner", "err", err)
	}
	return n, nil
}

// openCNINetwork loads the CNI configuration of a network.
func openCNINetwork(opts NetworkOptions, log *slog.Logger) (*cniNetwork, error) {
	if opts.Name == "" || strings.Trim(opts.Name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") != "" {
		return nil, fmt.Errorf("set up network: name %q: want letters, digits, '-' or '_'", opts.Name)
	}
	n := &cniNetwork{opts: opts, id: networkID(opts.Name), log: log}
	if n.opts.Subnet == "" {
		n.opts.Subnet = DefaultSubnet(opts.Name)
	}
	if _, _, err := net.ParseCIDR(n.opts.Subnet); err != nil {
		return nil, fmt.Errorf("set up network: subnet %q: %w", n.opts.Subnet, err)
	}
	for _, c := range opts.DenyCIDRs {
		if _, _, err := net.ParseCIDR(c); err != nil {
			return nil, fmt.Errorf("set up network: denied network %q: %w", c, err)
		}
	}
	for _, e := range opts.Allow {
		if ip := net.ParseIP(e.Addr); ip == nil || ip.To4() == nil {
			return nil, fmt.Errorf("set up network: allowed endpoint %q: want an IPv4 address", e.Addr)
		}
	}
	if len(n.opts.PluginDirs) == 0 {
		n.opts.PluginDirs = DefaultCNIPluginDirs
	}
	if n.opts.StateDir == "" {
		n.opts.StateDir = filepath.Join("/run/voyager/net", opts.Name)
	}
	// The plugins run iptables, found on PATH, which they inherit: a
	// process started with an empty environment gets the usual one.
	if os.Getenv("PATH") == "" {
		_ = os.Setenv("PATH", defaultPath)
		log.Info("PATH is empty; the CNI plugins get " + defaultPath)
	}
	for _, p := range []string{"bridge", "host-local", "portmap", "firewall", "loopback"} {
		if !slices.ContainsFunc(n.opts.PluginDirs, func(d string) bool { _, err := os.Stat(filepath.Join(d, p)); return err == nil }) {
			return nil, fmt.Errorf("set up network: CNI plugin %s not found in %v (apt-get install containernetworking-plugins, or run with the host's network)", p, n.opts.PluginDirs)
		}
	}
	// Linux caps interface names at 15 bytes, iptables chains at 28.
	n.bridge = "vy" + n.id
	n.fwd, n.in, n.ses, n.nat = "VY"+n.id+"-FWD", "VY"+n.id+"-IN", "VY"+n.id+"-SES", "VY"+n.id+"-NAT"
	conf, err := n.conflist()
	if err != nil {
		return nil, err
	}
	n.cni, err = gocni.New(gocni.WithPluginDir(n.opts.PluginDirs), gocni.WithMinNetworkCount(2),
		gocni.WithConfListBytes(conf), gocni.WithLoNetwork)
	if err != nil {
		return nil, fmt.Errorf("set up network: load CNI config: %w", err)
	}
	if n.ipt, err = iptables.New(); err != nil {
		return nil, fmt.Errorf("set up network: %w", err)
	}
	return n, nil
}

// inHost runs f in the machine's network namespace (HostNetNS), on one
// locked thread, so that the plugins and iptables it runs act there too.
func (n *cniNetwork) inHost(f func() error) error {
	if n.opts.HostNetNS == "" {
		return f()
	}
	return ns.WithNetNSPath(n.opts.HostNetNS, func(ns.NetNS) error { return f() })
}

// DefaultSubnet is the subnet of a network named name: a /24 in
// 10.128.0.0/10, so that instances on one machine rarely collide.
func DefaultSubnet(name string) string {
	sum := sha256.Sum256([]byte(name))
	v := binary.BigEndian.Uint16(sum[:2]) & 0x3fff // 14 bits: 10.128.0.0/10 in /24s
	return fmt.Sprintf("10.%d.%d.0/24", 128+int(v>>8), v&0xff)
}

// conflist is the CNI network: a bridge with host-local addresses and
// masquerading out, portmap for the published ports, and the firewall
// plugin, whose admin chain holds this network's rules.
func (n *cniNetwork) conflist() ([]byte, error) {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "voyager-" + n.opts.Name,
		"plugins": []any{
			map[string]any{
				// Masquerading is one rule of the instance (installChains),
				// not a chain per container as the plugin's ipMasq makes.
				"type": "bridge", "bridge": n.bridge, "isGateway": true, "ipMasq": false, "hairpinMode": false,
				"ipam": map[string]any{
					"type":   "host-local",
					"ranges": [][]map[string]string{{{"subnet": n.opts.Subnet}}},
					"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}, "snat": true},
			map[string]any{"type": "firewall", "backend": "iptables", "iptablesAdminChainName": n.fwd},
		},
	}
	b, err := json.Marshal(conf)
	if err != nil {
		return nil, fmt.Errorf("set up network: encode CNI config: %w", err)
	}
	return b, nil
}

// rule is one iptables rule, written as iptables -S prints it so that a
// chain can be compared with what it should hold.
type rule []string

func r(s string) rule { return strings.Fields(s) }

// fwdRules are the instance's FORWARD rules, in the firewall plugin's admin
// chain (which it jumps to before its own accepts).
func (n *cniNetwork) fwdRules() []rule {
	br := n.bridge
	rules := []rule{
		// Session to session, also through a port another publishes.
		r("-i " + br + " -o " + br + " -j DROP"),
	}
	rules = append(rules, n.allowRules()...)
	rules = append(rules, []rule{
		r("-o " + br + " -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"),
		// Ports published to some sources only: each such container's own
		// chain accepts those and drops the rest.
		r("-j " + n.ses),
		// Ports published to anyone: portmap's DNAT is what makes them.
		r("-o " + br + " -m conntrack --ctstate DNAT -j ACCEPT"),
		// Nothing else reaches a session.
		r("-o " + br + " -j DROP"),
	}...)
	for _, c := range n.opts.DenyCIDRs {
		rules = append(rules, r("-i "+br+" -d "+c+" -j DROP"))
	}
	// The control plane's endpoints on other machines (DenyEndpoints).
	rules = append(rules, r("-i "+br+" -j "+n.cpChain()))
	if p := n.opts.BlockedPorts; p[0] > 0 && p[1] >= p[0] {
		span := strconv.Itoa(p[0]) + ":" + strconv.Itoa(p[1])
		rules = append(rules,
			r("-i "+br+" -p tcp -m tcp --dport "+span+" -j DROP"),
			r("-i "+br+" -p udp -m udp --dport "+span+" -j DROP"))
	}
	return rules
}

// inRules keep sessions off every listener of the host (etcd, the agent,
// the API, anything bound to a host address or to the bridge's gateway):
// only replies to connections the host opened come in.
func (n *cniNetwork) inRules() []rule {
	rules := []rule{r("-i " + n.bridge + " -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")}
	rules = append(rules, n.allowRules()...)
	return append(rules, r("-i "+n.bridge+" -j DROP"))
}

// allowRules let sessions reach the configured endpoints.
func (n *cniNetwork) allowRules() []rule {
	var rules []rule
	for _, e := range n.opts.Allow {
		for _, p := range e.Ports {
			rules = append(rules, r("-d "+e.Addr+"/32 -i "+n.bridge+" -p tcp -m tcp --dport "+strconv.Itoa(p)+" -j ACCEPT"))
		}
	}
	return rules
}

// installChains makes the instance's chains hold exactly their rules and
// puts the INPUT jump first. The per-container chains are left alone:
// containers that outlive an agent restart keep their rules.
func (n *cniNetwork) installChains() error {
	for _, c := range []struct {
		chain string
		rules []rule
	}{{n.ses, nil}, {n.cpChain(), nil}, {n.fwd, n.fwdRules()}, {n.in, n.inRules()}} {
		if err := n.syncChain(c.chain, c.rules, c.rules != nil); err != nil {
			return err
		}
	}
	jump := []string{"-j", n.in}
	ok, err := n.ipt.Exists("filter", "INPUT", jump...)
	if err == nil && !ok {
		err = n.ipt.Insert("filter", "INPUT", 1, jump...)
	}
	if err != nil {
		return fmt.Errorf("set up network: jump to %s from INPUT: %w", n.in, err)
	}
	// The mesh's nat chain before the masquerade, made here, once, not
	// by the first container that needs it: two starting at once would
	// both make it.
	if err := n.natChain(); err != nil {
		return err
	}
	masq := n.masqRule()
	// A masquerade of an earlier subnet of this network (its agent
	// claimed another since) goes first.
	err = n.deleteMasq(masq)
	if err == nil {
		ok, err = n.ipt.Exists("nat", "POSTROUTING", masq...)
	}
	if err == nil && !ok {
		err = n.ipt.Append("nat", "POSTROUTING", masq...)
	}
	if err != nil {
		return fmt.Errorf("set up network: masquerade: %w", err)
	}
	return nil
}

// masqRule masquerades what sessions send out of their subnet.
func (n *cniNetwork) masqRule() rule {
	return r("-s " + n.opts.Subnet + " ! -d " + n.opts.Subnet + " -m comment --comment " + n.masqComment() + " -j MASQUERADE")
}

// masqComment marks the network's masquerade rule as its own.
func (n *cniNetwork) masqComment() string { return "voyager-" + n.opts.Name }

// deleteMasq deletes every POSTROUTING rule marked as the network's
// masquerade (masqComment) but keep, whatever subnet it names: a network
// removed, or set up again, with a subnet other than the one its rule was
// made with (an agent's VOYAGER_AGENT_NETWORK_SUBNET is not in the
// owner record a sweep removes the network by) leaves none behind.
func (n *cniNetwork) deleteMasq(keep rule) error {
	rules, err := n.ipt.List("nat", "POSTROUTING")
	if err != nil {
		return fmt.Errorf("list nat POSTROUTING: %w", err)
	}
	var errs []error
	for _, line := range rules {
		spec := strings.Fields(line)
		if len(spec) < 3 || spec[0] != "-A" {
			continue
		}
		spec = spec[2:]
		i := slices.Index(spec, "--comment")
		if i < 0 || i+1 >= len(spec) || strings.Trim(spec[i+1], `"`) != n.masqComment() {
			continue
		}
		for j := range spec {
			spec[j] = strings.Trim(spec[j], `"`)
		}
		if slices.Equal(spec, keep) {
			continue
		}
		if err := n.ipt.Delete("nat", "POSTROUTING", spec...); err != nil {
			errs = append(errs, fmt.Errorf("delete masquerade %q: %w", line, err))
		}
	}
	return errors.Join(errs...)
}

// syncChain creates chain in the filter table if absent and, when exact,
// rewrites it if it holds anything but rules.
func (n *cniNetwork) syncChain(chain string, rules []rule, exact bool) error {
	return n.syncTable("filter", chain, rules, exact)
}

// syncTable is syncChain in table.
func (n *cniNetwork) syncTable(table, chain string, rules []rule, exact bool) error {
	exists, err := n.ipt.ChainExists(table, chain)
	if err != nil {
		return fmt.Errorf("set up network: chain %s: %w", chain, err)
	}
	if !exists {
		if err := n.ipt.NewChain(table, chain); err != nil {
			return fmt.Errorf("set up network: create chain %s: %w", chain, err)
		}
	}
	if !exact {
		return nil
	}
	if !exists { // new and empty: nothing to compare
		return n.appendRules(table, chain, rules)
	}
	have, err := n.ipt.List(table, chain)
	if err != nil {
		return fmt.Errorf("set up network: list chain %s: %w", chain, err)
	}
	want := []string{"-N " + chain}
	for _, ru := range rules {
		want = append(want, "-A "+chain+" "+strings.Join(ru, " "))
	}
	if slices.Equal(have, want) {
		return nil
	}
	if err := n.ipt.ClearChain(table, chain); err != nil {
		return fmt.Errorf("set up network: clear chain %s: %w", chain, err)
	}
	return n.appendRules(table, chain, rules)
}

func (n *cniNetwork) appendRules(table, chain string, rules []rule) error {
	for _, ru := range rules {
		if err := n.ipt.Append(table, chain, ru...); err != nil {
			return fmt.Errorf("set up network: chain %s: add %v: %w", chain, ru, err)
		}
	}
	return nil
}

// newNetNS creates a network namespace for a container.
func (n *cniNetwork) newNetNS() (string, error) {
	ns, err := netns.NewNetNS(filepath.Join(n.opts.StateDir, "netns"))
	if err != nil {
		return "", fmt.Errorf("create network namespace: %w", err)
	}
	return ns.GetPath(), nil
}

// containerChain is the chain of one container's own rules.
func (n *cniNetwork) containerChain(id string) string {
	sum := sha256.Sum256([]byte(id))
	return "VY" + n.id + "-" + hex.EncodeToString(sum[:4])
}

// portMaps are the published ports as portmap takes them: TCP (Jupyter's
// and Ray's ports are TCP; each protocol costs NAT rules).
func portMaps(publish []Published) []gocni.PortMapping {
	var pm []gocni.PortMapping
	for _, p := range publish {
		pm = append(pm, gocni.PortMapping{HostPort: int32(p.Port), ContainerPort: int32(p.Port), Protocol: "tcp"})
	}
	return pm
}

// resolve returns addr as an IPv4 address or CIDR, looking a host name up.
func resolve(ctx context.Context, addr string) (string, error) {
	if _, _, err := net.ParseCIDR(addr); err == nil || net.ParseIP(addr) != nil {
		return addr, nil
	}
	addrs, err := net.DefaultResolver.LookupHost(ctx, addr)
	if err != nil {
		return "", fmt.Errorf("resolve %s: %w", addr, err)
	}
	for _, a := range addrs {
		if ip := net.ParseIP(a); ip != nil && ip.To4() != nil {
			return a, nil
		}
	}
	return "", fmt.Errorf("resolve %s: no IPv4 address", addr)
}

// setup attaches the container's namespace to the network and publishes
// its ports. It returns the container's address; rules installs the
// container's own rules once its mesh is known.
func (n *cniNetwork) setup(ctx context.Context, id, nsPath string, spec Spec) (ip string, err error) {
	err = n.inHost(func() error {
		ip, err = n.attachHere(ctx, id, nsPath, spec.Publish)
		return err
	})
	return ip, err
}

// attachHere is setup in the machine's namespace. The plugins run one
// after another on this thread (go-cni's Setup would run them on other
// goroutines, outside HostNetNS).
func (n *cniNetwork) attachHere(ctx context.Context, id, nsPath string, publish []Published) (string, error) {
	res, err := n.cni.SetupSerially(ctx, id, nsPath, gocni.WithCapabilityPortMap(portMaps(publish)))
	// Containers started at once on one machine race in the firewall
	// plugin, which checks for its chains and then creates them: the loser
	// gets iptables' exit status 4 (a resource problem, the chain being
	// created). That is transient: undo the half-made attachment and try
	// again, a few times.
	for try := 1; err != nil && try < 4 && strings.Contains(err.Error(), "exit status 4") && ctx.Err() == nil; try++ {
		n.log.Debug("CNI setup raced another; retrying", "container", id, "try", try, "err", err)
		_ = n.cni.Remove(ctx, id, nsPath, gocni.WithCapabilityPortMap(portMaps(publish)))
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(try) * 100 * time.Millisecond):
		}
		res, err = n.cni.SetupSerially(ctx, id, nsPath, gocni.WithCapabilityPortMap(portMaps(publish)))
	}
	if err != nil {
		return "", fmt.Errorf("set up network of %s: %w", id, err)
	}
	ip := ""
	if c, ok := res.Interfaces["eth0"]; ok && len(c.IPConfigs) > 0 {
		ip = c.IPConfigs[0].IP.String()
	}
	if ip == "" {
		return "", fmt.Errorf("set up network of %s: CNI gave no address", id)
	}
	// Containers on one bridge never talk to each other at layer 2: each
	// host-side port is isolated (it forwards only to the bridge itself).
	for name, c := range res.Interfaces {
		if c.Sandbox != "" || name == n.bridge {
			continue
		}
		if out, err := exec.Command("ip", "link", "set", "dev", name, "type", "bridge_slave", "isolated", "on").CombinedOutput(); err != nil {
			return "", fmt.Errorf("set up network of %s: isolate bridge port %s: %w: %s", id, name, err, out)
		}
	}
	return ip, nil
}

// rules installs the container's own rules: what is not the same for
// every container (ports published to some sources only, endpoints it may
// reach in the blocked ports, its mesh, a denied egress). Most containers
// need none.
func (n *cniNetwork) rules(ctx context.Context, id, ip string, spec Spec, mesh []MeshPeer) error {
	return n.inHost(func() error { return n.rulesHere(ctx, id, ip, spec, mesh) })
}

func (n *cniNetwork) rulesHere(ctx context.Context, id, ip string, spec Spec, mesh []MeshPeer) error {
	var rules []rule
	// Its mesh first: TCP with each peer container, both ways, on any
	// port, ahead of a denied egress. The peers' addresses are their own
	// (not masqueraded: meshRoutes), so a rule names one container.
	for _, p := range mesh {
		rules = append(rules,
			r("-s "+p.Addr+"/32 -d "+ip+"/32 -o "+n.bridge+" -p tcp -j ACCEPT"),
			r("-s "+ip+"/32 -d "+p.Addr+"/32 -i "+n.bridge+" -p tcp -j ACCEPT"))
	}
	for _, p := range spec.Publish {
		if len(p.From) == 0 {
			continue // the instance's DNAT rule accepts it
		}
		port := " -p tcp -m tcp --dport " + strconv.Itoa(p.Port)
		for _, f := range p.From {
			src, err := resolve(ctx, f)
			if err != nil {
				return fmt.Errorf("set up network of %s: published port %d: %w", id, p.Port, err)
			}
			rules = append(rules, r("-s "+src+" -d "+ip+"/32 -o "+n.bridge+port+" -m conntrack --ctstate DNAT -j ACCEPT"))
		}
		rules = append(rules, r("-d "+ip+"/32 -o "+n.bridge+port+" -j DROP"))
	}
	for _, e := range spec.Reach {
		addr, err := resolve(ctx, e.Addr)
		if err != nil {
			return fmt.Errorf("set up network of %s: %w", id, err)
		}
		for _, p := range e.Ports {
			rules = append(rules, r("-s "+ip+"/32 -d "+addr+" -i "+n.bridge+" -p tcp -m tcp --dport "+strconv.Itoa(p)+" -j ACCEPT"))
		}
	}
	if spec.DenyEgress {
		// After the reach rules (its gang's ports): the allowed networks,
		// replies to what reached it (a browser on Jupyter), then nothing.
		// The instance's allowed endpoints are accepted before this chain.
		for _, c := range spec.EgressAllow {
			rules = append(rules, r("-s "+ip+"/32 -d "+c+" -i "+n.bridge+" -j ACCEPT"))
		}
		rules = append(rules,
			r("-s "+ip+"/32 -i "+n.bridge+" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"),
			r("-s "+ip+"/32 -i "+n.bridge+" -j DROP"))
	}
	if len(rules) == 0 {
		return nil
	}
	if err := n.meshRoutes(id, ip, mesh); err != nil {
		return err
	}
	chain := n.containerChain(id)
	if err := n.syncChain(chain, rules, true); err != nil {
		return err
	}
	jump := []string{"-j", chain}
	if ok, err := n.ipt.Exists("filter", n.ses, jump...); err != nil || !ok {
		if err := n.ipt.Append("filter", n.ses, jump...); err != nil {
			return fmt.Errorf("set up network of %s: %w", id, err)
		}
	}
	return nil
}

// meshRoutes makes the container's mesh reachable at the peers' own
// addresses: a route to each peer node's container subnet through that
// node (replaced if another node had it), and, in the container's own nat
// chain, the peers' addresses exempt from the masquerade, so that a peer
// sees this container's address and its rules can name it.
func (n *cniNetwork) meshRoutes(id, ip string, mesh []MeshPeer) error {
	if len(mesh) == 0 {
		return nil
	}
	_, own, _ := net.ParseCIDR(n.opts.Subnet)
	var nat []rule
	routed := map[string]bool{}
	for _, p := range mesh {
		a := net.ParseIP(p.Addr)
		_, sub, err := net.ParseCIDR(p.Subnet)
		switch {
		case a == nil || a.To4() == nil:
			return fmt.Errorf("set up network of %s: mesh peer address %q: want an IPv4 address", id, p.Addr)
		case err != nil || !sub.Contains(a):
			return fmt.Errorf("set up network of %s: mesh peer %s: subnet %q: want the CIDR its address is in", id, p.Addr, p.Subnet)
		case own.Contains(sub.IP) || sub.Contains(own.IP):
			return fmt.Errorf("set up network of %s: mesh peer %s: its node's container subnet %s overlaps this node's %s: give each agent its own VOYAGER_AGENT_NETWORK_SUBNET", id, p.Addr, p.Subnet, n.opts.Subnet)
		}
		nat = append(nat, r("-s "+ip+"/32 -d "+p.Addr+"/32 -j ACCEPT"))
		if p.Via == "" || routed[sub.String()] {
			continue
		}
		routed[sub.String()] = true
		if out, err := exec.Command("ip", "route", "replace", sub.String(), "via", p.Via).CombinedOutput(); err != nil {
			return fmt.Errorf("set up network of %s: route %s via %s: %w: %s (the nodes must share a link, or the network must route container subnets: VOYAGER_AGENT_JOB_ROUTES=fabric)", id, sub, p.Via, err, strings.TrimSpace(string(out)))
		}
	}
	chain := n.containerChain(id)
	if err := n.syncTable("nat", chain, nat, true); err != nil {
		return err
	}
	jump := []string{"-j", chain}
	if ok, err := n.ipt.Exists("nat", n.nat, jump...); err != nil || !ok {
		if err := n.ipt.Append("nat", n.nat, jump...); err != nil {
			return fmt.Errorf("set up network of %s: %w", id, err)
		}
	}
	return nil
}

// natChain makes the instance's nat chain, jumped to from POSTROUTING
// ahead of the masquerade: the containers' own nat chains, which exempt
// their mesh from it. installChains calls it, before any container.
func (n *cniNetwork) natChain() error {
	if err := n.syncTable("nat", n.nat, nil, false); err != nil {
		return err
	}
	jump := []string{"-j", n.nat}
	ok, err := n.ipt.Exists("nat", "POSTROUTING", jump...)
	if err == nil && !ok {
		err = n.ipt.Insert("nat", "POSTROUTING", 1, jump...)
	}
	if err != nil {
		return fmt.Errorf("set up network: jump to %s from POSTROUTING: %w", n.nat, err)
	}
	return nil
}

// teardown undoes setup and removes the namespace; every step is
// idempotent.
func (n *cniNetwork) teardown(ctx context.Context, id, nsPath string, publish []Published) error {
	return n.inHost(func() error { return n.teardownHere(ctx, id, nsPath, publish) })
}

func (n *cniNetwork) teardownHere(ctx context.Context, id, nsPath string, publish []Published) error {
	return n.teardownPorts(ctx, id, nsPath, portMaps(publish))
}

// teardownPorts is teardownHere with the port mappings as CNI knows them.
func (n *cniNetwork) teardownPorts(ctx context.Context, id, nsPath string, pm []gocni.PortMapping) error {
	var errs []error
	// iptables-nft fails a check of a jump to a chain that does not exist:
	// look for the chain first.
	chain := n.containerChain(id)
	if ok, err := n.ipt.ChainExists("filter", chain); err == nil && ok {
		if ok, _ := n.ipt.ChainExists("filter", n.ses); ok {
			if err := n.ipt.DeleteIfExists("filter", n.ses, "-j", chain); err != nil {
				errs = append(errs, err)
			}
		}
		if err := n.ipt.ClearAndDeleteChain("filter", chain); err != nil {
			errs = append(errs, err)
		}
	}
	if ok, err := n.ipt.ChainExists("nat", chain); err == nil && ok {
		if err := n.ipt.DeleteIfExists("nat", n.nat, "-j", chain); err != nil {
			errs = append(errs, err)
		}
		if err := n.ipt.ClearAndDeleteChain("nat", chain); err != nil {
			errs = append(errs, err)
		}
	}
	if err := n.cni.Remove(ctx, id, nsPath, gocni.WithCapabilityPortMap(pm)); err != nil {
		errs = append(errs, err)
	}
	if nsPath != "" {
		if err := netns.LoadNetNS(nsPath).Remove(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tear down network of %s: %w", id, err)
	}
	return nil
}

// cniCacheDir is where libcni records each attachment (its default).
const cniCacheDir = "/var/lib/cni/results"

// gc tears down what containers that are gone left behind: their CNI
// attachments (addresses, NAT rules of published ports, firewall rules),
// as libcni's cache records them, their chains, and the pins of network
// namespaces no live container uses. A container removed behind the
// runtime's back (by hand, or a containerd wiped clean) leaves these.
func (n *cniNetwork) gc(ctx context.Context, liveIDs, liveNS map[string]bool) error {
	var errs []error
	err := n.inHost(func() error {
		entries, err := os.ReadDir(cniCacheDir)
		if err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("read CNI cache: %w", err)
		}
		prefix := "voyager-" + n.opts.Name + "-"
		for _, e := range entries {
			id, ok := strings.CutPrefix(e.Name(), prefix)
			if !ok {
				continue
			}
			if id, ok = strings.CutSuffix(id, "-eth0"); !ok || liveIDs[id] {
				continue
			}
			var cached struct {
				CapabilityArgs struct {
					PortMappings []gocni.PortMapping `json:"portMappings"`
				} `json:"capabilityArgs"`
			}
			if b, err := os.ReadFile(filepath.Join(cniCacheDir, e.Name())); err == nil {
				_ = json.Unmarshal(b, &cached)
			}
			n.log.Info("tearing down the network of a container that is gone", "container", id)
			if err := n.teardownPorts(ctx, id, "", cached.CapabilityArgs.PortMappings); err != nil {
				errs = append(errs, err)
			}
		}
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	pins, _ := filepath.Glob(filepath.Join(n.opts.StateDir, "netns", "*"))
	for _, p := range pins {
		if !liveNS[p] {
			if err := netns.LoadNetNS(p).Remove(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("collect the network of gone containers: %w", err)
	}
	return nil
}

// remove tears down every container's network, then deletes the
// instance's chains, bridge and address records. The caller has removed
// every container first.
func (n *cniNetwork) remove(ctx context.Context) error {
	gcErr := n.gc(ctx, nil, nil)
	return errors.Join(gcErr, n.inHost(n.removeHere))
}

func (n *cniNetwork) removeHere() error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if ok, _ := n.ipt.ChainExists("filter", n.in); ok {
		add(n.ipt.DeleteIfExists("filter", "INPUT", "-j", n.in))
	}
	if ok, _ := n.ipt.ChainExists("filter", n.fwd); ok {
		if ok, _ := n.ipt.ChainExists("filter", "CNI-FORWARD"); ok {
			// The firewall plugin checks, then inserts, its jump: two
			// containers set up at once on a new network insert it twice.
			jump := []string{"-m", "comment", "--comment", "CNI firewall plugin admin overrides", "-j", n.fwd}
			for i := 0; i < 16; i++ {
				if ok, err := n.ipt.Exists("filter", "CNI-FORWARD", jump...); err != nil || !ok {
					add(err)
					break
				}
				add(n.ipt.Delete("filter", "CNI-FORWARD", jump...))
			}
		}
	}
	add(n.deleteMasq(nil))
	if ok, _ := n.ipt.ChainExists("nat", n.nat); ok {
		add(n.ipt.DeleteIfExists("nat", "POSTROUTING", "-j", n.nat))
	}
	// The instance's chains, and any container's left over, whose jumps
	// are in the instance's: flush them all, then delete them.
	for _, table := range []string{"nat", "filter"} {
		chains, err := n.ipt.ListChains(table)
		add(err)
		var ours []string
		for _, c := range chains {
			if strings.HasPrefix(c, "VY"+n.id+"-") {
				ours = append(ours, c)
				add(n.ipt.ClearChain(table, c))
			}
		}
		for _, c := range ours {
			add(n.ipt.DeleteChain(table, c))
		}
	}
	if out, err := exec.Command("ip", "link", "delete", n.bridge).CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot find device") {
		add(fmt.Errorf("delete bridge %s: %w: %s", n.bridge, err, out))
	}
	add(os.RemoveAll(n.ipamDir()))
	if len(errs) == 0 {
		// The state directory goes too when nothing is left in it (an
		// empty netns pin directory included).
		_ = os.Remove(filepath.Join(n.opts.StateDir, "netns"))
		_ = os.Remove(n.opts.StateDir)
		add(ForgetOwner("network", n.opts.Name))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove network %s: %w", n.opts.Name, err)
	}
	return nil
}

// RemoveNetwork tears down an isolated network without a runtime: every
// container attachment it still records, its chains, bridge and address
// records. For a machine that stops running sessions, and for tests whose
// agent is gone; the network's containers should be gone first.
func RemoveNetwork(ctx context.Context, opts NetworkOptions, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	n, err := openCNINetwork(opts, log)
	if err != nil {
		return err
	}
	return n.remove(ctx)
}

// encodePublish and decodePublish keep the published ports in a label.
func encodePublish(p []Published) string {
	b, _ := json.Marshal(p)
	return string(b)
}

func decodePublish(s string) []Published {
	var p []Published
	_ = json.Unmarshal([]byte(s), &p)
	return p
}
