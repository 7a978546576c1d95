package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

func main() {
	timeout := flag.Duration("timeout", 60*time.Second, "how long to wait for the other ranks")
	flag.StringVar(&meshMode, "mesh", "peer-ports", "where ranks meet each other: peer-ports (the first of VOYAGER_PEER_PORTS on VOYAGER_NODE_ADDR) or ephemeral (a port the kernel chooses on the address of NCCL_SOCKET_IFNAME, as NCCL does)")
	flag.BoolVar(&serve, "serve", false, "after the check, keep answering on the mesh endpoint until killed")
	flag.Parse()
	if meshMode != "peer-ports" && meshMode != "ephemeral" {
		fmt.Fprintf(os.Stderr, "rendezvous: -mesh %q: want peer-ports or ephemeral\n", meshMode)
		os.Exit(2)
	}
	if err := run(time.Now().Add(*timeout)); err != nil {
		fmt.Fprintln(os.Stderr, "rendezvous:", err)
		os.Exit(1)
	}
}

var (
	meshMode string
	serve    bool
)

type env struct {
	masterAddr       string
	masterPort, rank int
	world            int
	node             string // VOYAGER_NODE_ADDR
	self             string // this rank's peer endpoint
}

func readEnv() (env, error) {
	var e env
	var errs []error
	num := func(name string) int {
		v, err := strconv.Atoi(os.Getenv(name))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: want a number", name, os.Getenv(name)))
		}
		return v
	}
	e.masterAddr = os.Getenv("MASTER_ADDR")
	e.masterPort, e.rank, e.world = num("MASTER_PORT"), num("NODE_RANK"), num("WORLD_SIZE")
	peer, _, _ := strings.Cut(os.Getenv("VOYAGER_PEER_PORTS"), ",")
	if os.Getenv("VOYAGER_NODE_ADDR") == "" || peer == "" {
		errs = append(errs, errors.New("VOYAGER_NODE_ADDR and VOYAGER_PEER_PORTS must be set"))
	}
	e.node = os.Getenv("VOYAGER_NODE_ADDR")
	e.self = net.JoinHostPort(e.node, peer)
	if e.masterAddr == "" {
		errs = append(errs, errors.New("MASTER_ADDR is not set"))
	}
	if len(errs) == 0 && (e.world < 1 || e.rank < 0 || e.rank >= e.world) {
		errs = append(errs, fmt.Errorf("NODE_RANK %d outside 0 to WORLD_SIZE-1 (%d)", e.rank, e.world-1))
	}
	return e, errors.Join(errs...)
}

func run(deadline time.Time) error {
	e, err := readEnv()
	if err != nil {
		return err
	}
	if err := checkHostfile(e); err != nil {
		return err
	}
	// Listen for the mesh first, so that no peer dials before it is up.
	_, port, _ := net.SplitHostPort(e.self)
	if meshMode == "ephemeral" {
		port = "0"
	}
	mesh, err := net.Listen("tcp", ":"+port)
	if err != nil {
		return fmt.Errorf("listen on peer port: %w", err)
	}
	defer mesh.Close()
	if meshMode == "ephemeral" {
		addr, err := ifaceAddr()
		if err != nil {
			return err
		}
		e.self = net.JoinHostPort(addr, strconv.Itoa(mesh.Addr().(*net.TCPAddr).Port))
		fmt.Printf("rendezvous: rank %d advertises %s\n", e.rank, e.self)
	}
	// The rendezvous connections stay open until the end: a last barrier,
	// as torchrun's ranks meet again before they exit, so that rank 0
	// (whose exit ends the job) leaves only once every rank has checked
	// its mesh.
	var peers []string
	var conns []net.Conn
	if e.rank == 0 {
		peers, conns, err = master(e, deadline)
	} else {
		var c net.Conn
		peers, c, err = join(e, deadline)
		conns = []net.Conn{c}
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	if err != nil {
		return err
	}
	fmt.Printf("rendezvous: rank %d of %d: all %d ranks arrived\n", e.rank, e.world, e.world)
	if err := meshCheck(e, mesh, peers, deadline); err != nil {
		return err
	}
	fmt.Printf("rendezvous: rank %d of %d: connected to every other rank and every other rank to it\n", e.rank, e.world)
	if err := barrier(e, conns); err != nil {
		return err
	}
	if serve {
		fmt.Printf("rendezvous: rank %d serves its mesh endpoint %s\n", e.rank, e.self)
		for {
			c, err := mesh.Accept()
			if err != nil {
				return fmt.Errorf("serve mesh endpoint: %w", err)
			}
			_, _ = fmt.Fprintf(c, "HTTP/1.0 200 OK\r\nContent-Length: 7\r\n\r\nrank %d\n", e.rank%10)
			c.Close()
		}
	}
	return nil
}

// ifaceAddr is the IPv4 address of NCCL_SOCKET_IFNAME (eth0 when unset).
func ifaceAddr() (string, error) {
	name := os.Getenv("NCCL_SOCKET_IFNAME")
	if name == "" {
		name = "eth0"
	}
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return "", fmt.Errorf("find interface %s (NCCL_SOCKET_IFNAME): %w", name, err)
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return "", fmt.Errorf("addresses of %s: %w", name, err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
			return n.IP.String(), nil
		}
	}
	return "", fmt.Errorf("interface %s has no IPv4 address", name)
}

// checkHostfile checks VOYAGER_HOSTFILE: WORLD_SIZE lines, this rank's
// naming this node.
func checkHostfile(e env) error {
	path := os.Getenv("VOYAGER_HOSTFILE")
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read hostfile: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != e.world {
		return fmt.Errorf("hostfile %s has %d lines, want WORLD_SIZE %d", path, len(lines), e.world)
	}
	if f := strings.Fields(lines[e.rank]); len(f) != 2 || f[0] != e.node || !strings.HasPrefix(f[1], "slots=") {
		return fmt.Errorf("hostfile line %d is %q, want %q slots=N", e.rank+1, lines[e.rank], e.node)
	}
	return nil
}

// master accepts every other rank on MASTER_PORT, checks them and sends
// them the peer list, which it returns with their connections.
func master(e env, deadline time.Time) ([]string, []net.Conn, error) {
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(e.masterPort))
	if err != nil {
		return nil, nil, fmt.Errorf("listen on MASTER_PORT: %w", err)
	}
	defer ln.Close()
	_ = ln.(*net.TCPListener).SetDeadline(deadline)
	peers := make([]string, e.world)
	peers[0] = e.self
	conns := map[int]net.Conn{}
	var all []net.Conn
	for len(conns) < e.world-1 {
		c, err := ln.Accept()
		if err != nil {
			return nil, all, fmt.Errorf("wait for ranks (%d of %d arrived): %w", len(conns)+1, e.world, err)
		}
		all = append(all, c)
		_ = c.SetDeadline(deadline)
		var rank, world int
		var ep string
		line, err := bufio.NewReader(c).ReadString('\n')
		if _, serr := fmt.Sscanf(line, "hello %d %d %s", &rank, &world, &ep); err != nil || serr != nil {
			return nil, all, fmt.Errorf("a rank said %q: %v", line, errors.Join(err, serr))
		}
		switch {
		case world != e.world:
			return nil, all, fmt.Errorf("rank %d has WORLD_SIZE %d, rank 0 has %d", rank, world, e.world)
		case rank < 1 || rank >= e.world:
			return nil, all, fmt.Errorf("a rank says it is rank %d, want 1 to %d", rank, e.world-1)
		case conns[rank] != nil:
			return nil, all, fmt.Errorf("rank %d arrived twice", rank)
		}
		fmt.Printf("rendezvous: rank %d arrived from %s\n", rank, c.RemoteAddr())
		conns[rank], peers[rank] = c, ep
	}
	for _, c := range conns {
		if _, err := fmt.Fprintf(c, "peers %s\n", strings.Join(peers, " ")); err != nil {
			return nil, all, fmt.Errorf("send peers: %w", err)
		}
	}
	return peers, all, nil
}

// barrier: every rank tells rank 0 it is done, and waits until rank 0 has
// heard it from all.
func barrier(e env, conns []net.Conn) error {
	if e.rank != 0 {
		c := conns[0]
		if _, err := fmt.Fprintln(c, "done"); err != nil {
			return fmt.Errorf("tell rank 0 this rank is done: %w", err)
		}
		if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "bye\n" {
			return fmt.Errorf("wait for rank 0 at the last barrier: got %q: %v", line, err)
		}
		return nil
	}
	for _, c := range conns {
		if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "done\n" {
			return fmt.Errorf("wait for every rank at the last barrier: got %q: %v", line, err)
		}
	}
	for _, c := range conns {
		_, _ = fmt.Fprintln(c, "bye")
	}
	return nil
}

// join says hello to rank 0 and reads the peer list; it returns the
// connection to rank 0 too, for the last barrier.
func join(e env, deadline time.Time) ([]string, net.Conn, error) {
	addr := net.JoinHostPort(e.masterAddr, strconv.Itoa(e.masterPort))
	c, err := dial(addr, deadline)
	if err != nil {
		return nil, nil, fmt.Errorf("reach rank 0 at MASTER_ADDR:MASTER_PORT %s: %w", addr, err)
	}
	_ = c.SetDeadline(deadline)
	if _, err := fmt.Fprintf(c, "hello %d %d %s\n", e.rank, e.world, e.self); err != nil {
		return nil, c, fmt.Errorf("say hello to rank 0: %w", err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return nil, c, fmt.Errorf("wait for rank 0's peer list: %w", err)
	}
	peers := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "peers "))
	if len(peers) != e.world {
		return nil, c, fmt.Errorf("rank 0 sent %d peers, want %d: %q", len(peers), e.world, line)
	}
	return peers, c, nil
}

// meshCheck connects to every other rank's endpoint and accepts every
// other rank's connection, each saying its rank.
func meshCheck(e env, ln net.Listener, peers []string, deadline time.Time) error {
	errc := make(chan error, 1)
	go func() {
		_ = ln.(*net.TCPListener).SetDeadline(deadline)
		seen := map[int]bool{}
		for len(seen) < e.world-1 {
			c, err := ln.Accept()
			if err != nil {
				errc <- fmt.Errorf("wait for the other ranks' connections (%d of %d): %w", len(seen), e.world-1, err)
				return
			}
			var rank int
			_ = c.SetDeadline(deadline)
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if _, err := fmt.Sscanf(line, "mesh %d", &rank); err != nil || rank == e.rank || rank < 0 || rank >= e.world || seen[rank] {
				errc <- fmt.Errorf("a peer connection said %q", line)
				return
			}
			seen[rank] = true
		}
		errc <- nil
	}()
	var failed []string
	for r, ep := range peers {
		if r == e.rank {
			continue
		}
		c, err := dial(ep, deadline)
		if err != nil {
			failed = append(failed, fmt.Sprintf("rank %d at %s: %v", r, ep, err))
			continue
		}
		_, _ = fmt.Fprintf(c, "mesh %d\n", e.rank)
		c.Close()
	}
	if len(failed) > 0 {
		sort.Strings(failed)
		return fmt.Errorf("reach the other ranks: %s", strings.Join(failed, "; "))
	}
	return <-errc
}

// dial connects to addr, retrying until deadline: the other side may not
// listen yet.
func dial(addr string, deadline time.Time) (net.Conn, error) {
	for {
		c, err := net.DialTimeout("tcp", addr, 3*time.Second)
		if err == nil {
			return c, nil
		}
		if time.Now().Add(500 * time.Millisecond).After(deadline) {
			return nil, err
		}
		time.Sleep(500 * time.Millisecond)
	}
}
