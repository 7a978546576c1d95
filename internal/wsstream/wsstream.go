package wsstream

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// Channels: the first byte of every message.
const (
	// Stdin carries bytes from the client to the process (or to the
	// forwarded port).
	Stdin byte = 0
	// Stdout carries the process's standard output (with a terminal, all
	// of its output), or the bytes the forwarded port sends back.
	Stdout byte = 1
	// Stderr carries the process's standard error (never with a terminal).
	Stderr byte = 2
	// Resize carries a TermSize as JSON: the client's terminal changed.
	Resize byte = 3
	// CloseStdin has no payload: the client's input ended (EOF).
	CloseStdin byte = 4
	// Exit carries an ExitStatus as JSON; the server sends nothing after it.
	Exit byte = 5
)

// Subprotocols name the two uses in Sec-WebSocket-Protocol.
const (
	ExecProtocol    = "v1.exec.voyager"
	ForwardProtocol = "v1.forward.voyager"
)

// MaxMessage is the largest message a reader accepts; writers split
// larger payloads (ChunkSize).
const (
	MaxMessage = 1 << 20
	ChunkSize  = 32 << 10
)

// writeWait bounds one message's write, so that a peer that stopped
// reading cannot hold a writer for ever.
const writeWait = 30 * time.Second

// TermSize is a terminal's size in character cells.
type TermSize struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// ExitStatus ends a stream: the process's exit code, or why it could not
// run (Error, with ExitCode -1). A forwarded connection ends with 0 when
// the port closed it.
type ExitStatus struct {
	ExitCode int    `json:"exitCode"`
	Error    string `json:"error,omitempty"`
}

// Upgrader accepts the WebSocket handshake of either protocol. Origin is
// not checked: these endpoints take a bearer token in the Authorization
// header (or a key in the URL), which a browser page cannot send on a
// WebSocket, so no ambient credential can be ridden.
var Upgrader = websocket.Upgrader{
	Subprotocols:    []string{ExecProtocol, ForwardProtocol},
	ReadBufferSize:  ChunkSize,
	WriteBufferSize: ChunkSize,
	CheckOrigin:     func(*http.Request) bool { return true },
}

// Conn is one end of a stream: a WebSocket with writes serialised (the
// WebSocket allows one writer at a time).
type Conn struct {
	ws *websocket.Conn
	mu sync.Mutex
}

// New wraps ws; it bounds the messages it reads to MaxMessage.
func New(ws *websocket.Conn) *Conn {
	ws.SetReadLimit(MaxMessage)
	return &Conn{ws: ws}
}

// WS is the underlying WebSocket.
func (c *Conn) WS() *websocket.Conn { return c.ws }

// Send writes one message on channel ch.
func (c *Conn) Send(ch byte, p []byte) error {
	msg := make([]byte, 1+len(p))
	msg[0] = ch
	copy(msg[1:], p)
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = c.ws.SetWriteDeadline(time.Now().Add(writeWait))
	if err := c.ws.WriteMessage(websocket.BinaryMessage, msg); err != nil {
		return fmt.Errorf("write stream message: %w", err)
	}
	return nil
}

// SendJSON writes v as JSON on channel ch.
func (c *Conn) SendJSON(ch byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode stream message: %w", err)
	}
	return c.Send(ch, b)
}

// SendExit writes the Exit message and closes the WebSocket cleanly.
func (c *Conn) SendExit(st ExitStatus) error {
	err := c.SendJSON(Exit, st)
	c.mu.Lock()
	_ = c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	c.mu.Unlock()
	return err
}

// ErrEmpty is a message without a channel byte.
var ErrEmpty = errors.New("read stream message: empty message")

// Recv reads the next message: its channel and payload. A text message is
// an error; a closed WebSocket is io.EOF.
func (c *Conn) Recv() (byte, []byte, error) {
	t, p, err := c.ws.ReadMessage()
	if err != nil {
		var ce *websocket.CloseError
		if errors.As(err, &ce) {
			return 0, nil, io.EOF
		}
		return 0, nil, fmt.Errorf("read stream message: %w", err)
	}
	if t != websocket.BinaryMessage {
		return 0, nil, fmt.Errorf("read stream message: want binary messages, got type %d", t)
	}
	if len(p) == 0 {
		return 0, nil, ErrEmpty
	}
	return p[0], p[1:], nil
}

// Close closes the WebSocket without a close message.
func (c *Conn) Close() error { return c.ws.Close() }

// Writer returns an io.Writer whose writes go out on channel ch, split
// into messages of at most ChunkSize.
func (c *Conn) Writer(ch byte) io.Writer { return chanWriter{c: c, ch: ch} }

type chanWriter struct {
	c  *Conn
	ch byte
}

func (w chanWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), ChunkSize)
		if err := w.c.Send(w.ch, p[:k]); err != nil {
			return n, err
		}
		n += k
		p = p[k:]
	}
	return n, nil
}

// Relay copies messages between a and b, both ways and unchanged, until
// either ends; seen (when not nil) is called with every message from b
// before it is passed on (the API reads the Exit message there). When b
// ends a's WebSocket is closed cleanly, and the other way round. It
// returns the error that ended it, nil for a clean close.
func Relay(a, b *Conn, seen func(ch byte, p []byte)) error {
	errc := make(chan error, 2)
	pipe := func(from, to *Conn, hook func(byte, []byte)) {
		for {
			ch, p, err := from.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				to.mu.Lock()
				_ = to.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
				to.mu.Unlock()
				errc <- err
				return
			}
			if hook != nil {
				hook(ch, p)
			}
			if err := to.Send(ch, p); err != nil {
				errc <- err
				return
			}
		}
	}
	go pipe(a, b, nil)
	go pipe(b, a, seen)
	err := <-errc
	// The other direction ends when its reader sees the peer answer the
	// close: closing at once could reset a connection whose peer still
	// has the last messages to read.
	select {
	case <-errc:
		_ = a.ws.Close()
		_ = b.ws.Close()
	case <-time.After(closeWait):
		_ = a.ws.Close()
		_ = b.ws.Close()
		<-errc
	}
	return err
}

// closeWait is how long Relay waits for a peer to answer a close.
const closeWait = 5 * time.Second
