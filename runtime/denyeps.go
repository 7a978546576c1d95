package runtime

import (
	"fmt"
	"net"
	"slices"
	"strconv"
)

// cpChain is the instance's chain of denied endpoints (DenyEndpoints),
// jumped to from its FORWARD rules after the allowed endpoints.
func (n *cniNetwork) cpChain() string { return "VY" + n.id + "-CP" }

// cpRules drop what sessions send to each endpoint of eps: each of its
// TCP ports, or the whole address when it names none.
func cpRules(eps []Endpoint) []rule {
	var rules []rule
	for _, e := range eps {
		if len(e.Ports) == 0 {
			rules = append(rules, r("-d "+e.Addr+"/32 -j DROP"))
			continue
		}
		for _, p := range e.Ports {
			rules = append(rules, r("-d "+e.Addr+"/32 -p tcp -m tcp --dport "+strconv.Itoa(p)+" -j DROP"))
		}
	}
	return rules
}

// DenyEndpoints makes eps the endpoints this instance's containers may
// not reach (on other machines: this machine's own listeners are shut to
// them already), replacing the previous set: the control plane's (etcd
// members' client and peer ports, the APIs, the other nodes' agents),
// which change as processes come and go. Endpoints allowed by
// NetworkOptions.Allow stay reachable. On the host's network it does
// nothing: nothing is isolated there.
func (c *Containerd) DenyEndpoints(eps []Endpoint) error {
	if c.net == nil {
		return nil
	}
	for _, e := range eps {
		if ip := net.ParseIP(e.Addr); ip == nil || ip.To4() == nil {
			return fmt.Errorf("deny endpoint %q: want an IPv4 address", e.Addr)
		}
		if slices.ContainsFunc(e.Ports, func(p int) bool { return p < 1 || p > 65535 }) {
			return fmt.Errorf("deny endpoint %s: ports %v: want 1 to 65535", e.Addr, e.Ports)
		}
	}
	n := c.net
	if err := n.inHost(func() error { return n.syncChain(n.cpChain(), cpRules(eps), true) }); err != nil {
		return fmt.Errorf("deny endpoints: %w", err)
	}
	return nil
}
