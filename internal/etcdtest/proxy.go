package etcdtest

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
)

// Proxy is a TCP proxy in front of an etcd endpoint that a test can cut,
// as a network partition would: while cut, the connections it holds and the
// ones it accepts stay open but carry nothing (no reset, no answer), so a
// client sees its calls hang, not fail fast.
type Proxy struct {
	l      net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]bool // every connection, both sides
	wg    sync.WaitGroup
}

// NewProxy starts a proxy on a free loopback port that forwards to target
// (host:port, or a URL such as http://127.0.0.1:2379), and closes it at
// cleanup.
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("proxy: listen: %v", err)
	}
	target = strings.TrimPrefix(strings.TrimPrefix(target, "http://"), "https://")
	p := &Proxy{l: l, target: target, conns: map[net.Conn]bool{}}
	p.wg.Go(p.accept)
	tb.Cleanup(p.close)
	return p
}

// Endpoint is the URL clients dial instead of the target.
func (p *Proxy) Endpoint() string { return "http://" + p.l.Addr().String() }

// Cut stops all traffic: connections go silent, new ones are held silent.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	// Close the etcd side only: the client side stays open and silent.
	for c, upstream := range p.conns {
		if upstream {
			_ = c.Close()
			delete(p.conns, c)
		}
	}
}

// Restore lets traffic through again. The connections held while cut are
// closed, so clients dial afresh.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

func (p *Proxy) accept() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns[c] = false
		cut := p.cut
		p.mu.Unlock()
		if cut {
			continue // held open, silent, until Restore or close
		}
		p.wg.Go(func() { p.forward(c) })
	}
}

func (p *Proxy) forward(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	if _, open := p.conns[c]; p.cut || !open {
		p.mu.Unlock()
		_ = up.Close()
		return
	}
	p.conns[up] = true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src) // ends when either side goes
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	// One direction ended. If the proxy is cut, the client side stays
	// open and silent; otherwise both sides go.
	p.mu.Lock()
	cut := p.cut
	delete(p.conns, up)
	if !cut {
		delete(p.conns, c)
	}
	p.mu.Unlock()
	_ = up.Close()
	if !cut {
		_ = c.Close()
	}
	<-done
}

func (p *Proxy) close() {
	_ = p.l.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = map[net.Conn]bool{}
	p.mu.Unlock()
	p.wg.Wait()
}
