package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// endpointTTL is the lease of a control-plane endpoint record: a process
// that dies leaves its record this long at most.
const endpointTTL = 15 * time.Second

// advertisedAddrs are the host:port addresses other machines reach a
// listener on listen at: advertise's, when given (an agent's address);
// none for a loopback listener; every IPv4 address of the machine's
// interfaces but loopback for a wildcard one; else its own.
func advertisedAddrs(listen, advertise string) []string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return nil
	}
	if advertise != "" {
		if ip := net.ParseIP(advertise); ip != nil && ip.To4() != nil {
			if ip.IsLoopback() {
				return nil
			}
			return []string{net.JoinHostPort(advertise, port)}
		}
	}
	ip := net.ParseIP(host)
	switch {
	case ip != nil && ip.IsLoopback():
		return nil
	case host == "" || ip != nil && ip.IsUnspecified():
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			return nil
		}
		var out []string
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
				out = append(out, net.JoinHostPort(n.IP.String(), port))
			}
		}
		return out
	case ip != nil && ip.To4() != nil:
		return []string{listen}
	}
	return nil
}

// endpointComponent keeps this process's control-plane record
// (controlplane/<kind>/<name>) in etcd under a lease for as long as it
// runs, so that every agent denies its sessions these addresses. With no
// address other machines reach (a loopback listener), it records nothing.
func endpointComponent(cli *clientv3.Client, k state.Keys, kind, name string, addrs []string, log *slog.Logger) component {
	return component{name: "controlplane-record", run: func(ctx context.Context) error {
		if len(addrs) == 0 {
			<-ctx.Done()
			return nil
		}
		key := k.ControlPlane(kind, name)
		for {
			err := keepEndpoint(ctx, cli, key, state.Endpoints{Kind: kind, Name: name, Addresses: addrs}, log)
			if ctx.Err() != nil {
				return nil
			}
			log.Warn("control-plane record lost; writing it again", "key", key, "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
			}
		}
	}}
}

// keepEndpoint writes rec at key under a new lease and keeps the lease
// alive until ctx ends (then revokes it) or the lease is lost.
func keepEndpoint(ctx context.Context, cli *clientv3.Client, key string, rec state.Endpoints, log *slog.Logger) error {
	lease, err := cli.Grant(ctx, int64(endpointTTL/time.Second))
	if err != nil {
		return fmt.Errorf("grant control-plane lease: %w", err)
	}
	rec.Updated = time.Now().UTC()
	v, err := state.Encode(rec)
	if err != nil {
		return err
	}
	if _, err := cli.Put(ctx, key, v, clientv3.WithLease(lease.ID)); err != nil {
		return fmt.Errorf("write control-plane record: %w", err)
	}
	log.Debug("control-plane record written", "key", key, "addresses", rec.Addresses)
	ch, err := cli.KeepAlive(ctx, lease.ID)
	if err != nil {
		return fmt.Errorf("keep control-plane lease: %w", err)
	}
	for range ch {
	}
	if ctx.Err() != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_, _ = cli.Revoke(rctx, lease.ID)
		return nil
	}
	return fmt.Errorf("control-plane lease %x lost", lease.ID)
}

// endpointName names a process's record by its first address.
func endpointName(addrs []string) string {
	if len(addrs) == 0 {
		return ""
	}
	return strings.NewReplacer(":", "-", ".", "-").Replace(addrs[0])
}

// endpointDenier is what the control-plane guard needs of the runtime.
type endpointDenier interface {
	DenyEndpoints([]runtime.Endpoint) error
}

var _ endpointDenier = (*runtime.Containerd)(nil)

// controlPlaneGuard keeps the agent's sessions off every control-plane
// endpoint the agent knows: the etcd members' client and peer ports (its
// endpoints and the member list), and every record under controlplane/
// (the APIs, the placers, the other nodes' agents). It recomputes the set
// every few seconds from a watch cache and the member list, and rewrites
// the runtime's rules when the set changed.
type controlPlaneGuard struct {
	cli     *clientv3.Client
	rt      endpointDenier
	records *watcher.Cache[state.Endpoints]
	static  []string // the configured etcd endpoints, host:port
	log     *slog.Logger

	members []string // host:port of every member's client and peer URLs
	applied []runtime.Endpoint
}

// newControlPlaneGuard builds the guard and applies the endpoints it can
// learn now (etcd's member list and the records in etcd), so that no
// session starts before its rules are in.
func newControlPlaneGuard(ctx context.Context, cli *clientv3.Client, cfg config.Config, rt endpointDenier, log *slog.Logger) (*controlPlaneGuard, error) {
	k := state.MustKeys(cfg.EtcdPrefix)
	g := &controlPlaneGuard{cli: cli, rt: rt, log: log,
		records: watcher.New(cli, k.ControlPlaneDir(), watcher.JSON[state.Endpoints], watcher.Options{Name: "agent-controlplane", Logger: log})}
	for _, ep := range cfg.EtcdEndpoints {
		if hp := urlHostPort(ep); hp != "" {
			g.static = append(g.static, hp)
		}
	}
	g.refreshMembers(ctx)
	resp, err := cli.Get(ctx, k.ControlPlaneDir(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read control-plane records: %w", err)
	}
	var recs []state.Endpoints
	for _, kv := range resp.Kvs {
		if rec, err := state.Decode[state.Endpoints](kv.Value); err == nil {
			recs = append(recs, rec)
		}
	}
	if err := g.apply(recs); err != nil {
		return nil, err
	}
	return g, nil
}

func (g *controlPlaneGuard) component() component {
	return component{name: "controlplane-guard", run: g.run}
}

// run keeps the rules current until ctx ends.
func (g *controlPlaneGuard) run(ctx context.Context) error {
	eg, ctx := errgroup.WithContext(ctx)
	eg.Go(func() error { return g.records.Run(ctx) })
	eg.Go(func() error {
		tick := time.NewTicker(3 * time.Second)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			}
			if n%10 == 9 {
				g.refreshMembers(ctx)
			}
			var recs []state.Endpoints
			for _, it := range g.records.List() {
				recs = append(recs, it.Value)
			}
			if err := g.apply(recs); err != nil {
				g.log.Error("control-plane endpoints not denied to sessions", "err", err)
			}
		}
	})
	err := eg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// refreshMembers reads the etcd members' client and peer URLs; on an
// error it keeps what it had.
func (g *controlPlaneGuard) refreshMembers(ctx context.Context) {
	mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := g.cli.MemberList(mctx)
	if err != nil {
		g.log.Debug("etcd member list unread; keeping the last", "err", err)
		return
	}
	var out []string
	for _, m := range resp.Members {
		for _, u := range append(slices.Clone(m.ClientURLs), m.PeerURLs...) {
			if hp := urlHostPort(u); hp != "" {
				out = append(out, hp)
			}
		}
	}
	g.members = out
}

// apply denies the endpoints of recs, the members and the configured etcd
// endpoints, when they differ from those applied last.
func (g *controlPlaneGuard) apply(recs []state.Endpoints) error {
	ports := map[string][]int{}
	add := func(hostPort string) {
		host, p, err := net.SplitHostPort(hostPort)
		if err != nil {
			return
		}
		port, err := strconv.Atoi(p)
		if err != nil {
			return
		}
		ips := []net.IP{net.ParseIP(host)}
		if ips[0] == nil {
			found, err := net.LookupIP(host)
			if err != nil {
				return
			}
			ips = found
		}
		for _, ip := range ips {
			if ip4 := ip.To4(); ip4 != nil && !ip4.IsLoopback() {
				ports[ip4.String()] = append(ports[ip4.String()], port)
			}
		}
	}
	for _, hp := range g.static {
		add(hp)
	}
	for _, hp := range g.members {
		add(hp)
	}
	for _, r := range recs {
		for _, hp := range r.Addresses {
			add(hp)
		}
	}
	eps := make([]runtime.Endpoint, 0, len(ports))
	for addr, ps := range ports {
		slices.Sort(ps)
		eps = append(eps, runtime.Endpoint{Addr: addr, Ports: slices.Compact(ps)})
	}
	slices.SortFunc(eps, func(a, b runtime.Endpoint) int { return strings.Compare(a.Addr, b.Addr) })
	if slices.EqualFunc(eps, g.applied, func(a, b runtime.Endpoint) bool { return a.Addr == b.Addr && slices.Equal(a.Ports, b.Ports) }) && g.applied != nil {
		return nil
	}
	if err := g.rt.DenyEndpoints(eps); err != nil {
		return err
	}
	g.log.Info("control-plane endpoints denied to sessions", "endpoints", len(eps))
	g.applied = eps
	return nil
}

// urlHostPort is the host:port of an etcd URL (http(s)://host:port), or
// "" when it has none.
func urlHostPort(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return ""
	}
	if u.Port() == "" {
		return ""
	}
	return u.Host
}

// agentControlPlane returns an agent's control-plane components: the
// record of its HTTPS endpoint (on its node's address), and the guard
// that denies its sessions the control plane, primed before any session
// starts (unless VOYAGER_AGENT_NETWORK_DENY_CONTROL_PLANE is false).
func agentControlPlane(ctx context.Context, cli *clientv3.Client, cfg config.Config, parts *agentParts, httpAddr string, log *slog.Logger) ([]component, error) {
	k := state.MustKeys(cfg.EtcdPrefix)
	comps := []component{endpointComponent(cli, k, state.EndpointAgent, parts.node, advertisedAddrs(httpAddr, cfg.AgentAddress), log)}
	if !cfg.AgentDenyControlPlane {
		log.Warn("sessions may reach the control plane on other machines: " + config.EnvAgentDenyControl + " is false (debugging only)")
		return comps, nil
	}
	g, err := newControlPlaneGuard(ctx, cli, cfg, parts.rt, log)
	if err != nil {
		return nil, err
	}
	return append(comps, g.component()), nil
}

// selfEndpoint is the record of an API's or placer's HTTP endpoint
// (listening on httpAddr), named by its first address.
func selfEndpoint(cli *clientv3.Client, cfg config.Config, kind, httpAddr string, log *slog.Logger) component {
	addrs := advertisedAddrs(httpAddr, "")
	return endpointComponent(cli, state.MustKeys(cfg.EtcdPrefix), kind, endpointName(addrs), addrs, log)
}
