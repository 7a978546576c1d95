package etcdtest

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
)

// Link is one client's connections to etcd, cut inside the client's own
// dialer as a network partition cuts them: while cut, the etcd side of
// each connection is closed and the client's side stays open and silent
// (reads wait, writes vanish as into a buffer nobody reads), and so do the
// connections the client dials meanwhile; Restore closes those, so the
// client dials afresh. It is Proxy's fault without a proxy: no copy of
// every byte through another process's sockets (the soak's proxies took
// about a tenth of its test process's CPU), and one Link cuts a client
// from every member at once. The client must dial through it
// (DialOption).
type Link struct {
	mu    sync.Mutex
	cut   bool
	conns map[*linkConn]struct{}
}

// NewLink returns a Link that is not cut.
func NewLink() *Link { return &Link{conns: map[*linkConn]struct{}{}} }

// DialOption makes a gRPC client (clientv3.Config.DialOptions) dial
// through l.
func (l *Link) DialOption() grpc.DialOption { return grpc.WithContextDialer(l.Dial) }

// Dial connects to addr (host:port, or unix:///path for a unix socket),
// or, while l is cut, returns a connection that stays silent until
// Restore closes it.
func (l *Link) Dial(ctx context.Context, addr string) (net.Conn, error) {
	l.mu.Lock()
	cut := l.cut
	l.mu.Unlock()
	if cut {
		return l.silent(addr), nil
	}
	var d net.Dialer
	network := "tcp"
	if path, ok := SocketPath(addr); ok {
		network, addr = "unix", path
	}
	up, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c := &linkConn{Conn: up, l: l, local: up.LocalAddr(), remote: up.RemoteAddr(), closed: make(chan struct{})}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut { // cut while dialling
		_ = up.Close()
		c.Conn = nil
		c.cut.Store(true)
	}
	l.conns[c] = struct{}{}
	return c, nil
}

// SocketPath returns the socket's path of a unix endpoint or address
// (unix:///path, as Members' Endpoints and gRPC's dialer give it) and
// true; false for any other.
func SocketPath(addr string) (string, bool) { return strings.CutPrefix(addr, "unix://") }

// silent is a connection dialled while l is cut: it connects nowhere.
func (l *Link) silent(addr string) *linkConn {
	var remote net.Addr
	if path, ok := SocketPath(addr); ok {
		remote = &net.UnixAddr{Name: path, Net: "unix"}
	} else {
		remote, _ = net.ResolveTCPAddr("tcp", addr)
	}
	c := &linkConn{l: l, local: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, remote: remote, closed: make(chan struct{})}
	c.cut.Store(true)
	l.mu.Lock()
	l.conns[c] = struct{}{}
	l.mu.Unlock()
	return c
}

// Cut stops all traffic: every connection goes silent (its etcd side
// closed), and so does every connection dialled until Restore.
func (l *Link) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = true
	for c := range l.conns {
		if !c.cut.Swap(true) && c.Conn != nil {
			_ = c.Conn.Close() // the etcd side: etcd sees the client go
		}
	}
}

// Restore lets traffic through again. The connections held silent are
// closed, so the client dials afresh.
func (l *Link) Restore() {
	l.mu.Lock()
	l.cut = false
	var held []*linkConn
	for c := range l.conns {
		if c.cut.Load() {
			held = append(held, c)
		}
	}
	l.mu.Unlock()
	for _, c := range held {
		_ = c.Close()
	}
}

// linkConn is one connection of a Link: the etcd side (nil for one
// dialled while cut) and whether it was cut. It deliberately does not
// expose the TCP connection's file (syscall.Conn): gRPC would read from
// it directly, past the cut.
type linkConn struct {
	net.Conn
	l             *Link
	local, remote net.Addr
	cut           atomic.Bool
	closed        chan struct{}
	once          sync.Once
}

func (c *linkConn) Read(b []byte) (int, error) {
	if c.cut.Load() {
		<-c.closed
		return 0, net.ErrClosed
	}
	n, err := c.Conn.Read(b)
	if err != nil && c.cut.Load() {
		<-c.closed // cut under the read: silent from now on
		return 0, net.ErrClosed
	}
	return n, err
}

func (c *linkConn) Write(b []byte) (int, error) {
	if c.cut.Load() {
		select {
		case <-c.closed:
			return 0, net.ErrClosed
		default:
			return len(b), nil
		}
	}
	n, err := c.Conn.Write(b)
	if err != nil && c.cut.Load() {
		return len(b), nil
	}
	return n, err
}

// Close closes the client's side (and the etcd side, if not yet).
func (c *linkConn) Close() error {
	c.once.Do(func() {
		close(c.closed)
		if c.Conn != nil {
			_ = c.Conn.Close()
		}
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return nil
}

func (c *linkConn) LocalAddr() net.Addr  { return c.local }
func (c *linkConn) RemoteAddr() net.Addr { return c.remote }

func (c *linkConn) SetDeadline(t time.Time) error {
	if c.Conn == nil || c.cut.Load() {
		return nil
	}
	return c.Conn.SetDeadline(t)
}

func (c *linkConn) SetReadDeadline(t time.Time) error {
	if c.Conn == nil || c.cut.Load() {
		return nil
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *linkConn) SetWriteDeadline(t time.Time) error {
	if c.Conn == nil || c.cut.Load() {
		return nil
	}
	return c.Conn.SetWriteDeadline(t)
}
