package wsstream_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/voyager-gpu/voyager/internal/wsstream"
)

// serve runs handler behind a WebSocket endpoint and returns a client
// connection to it.
func serve(t *testing.T, handler func(*wsstream.Conn)) *wsstream.Conn {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := wsstream.Upgrader.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		c := wsstream.New(ws)
		defer c.Close()
		handler(c)
	}))
	t.Cleanup(srv.Close)
	d := websocket.Dialer{Subprotocols: []string{wsstream.ExecProtocol}}
	ws, _, err := d.Dial("ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := wsstream.New(ws)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// echo answers every Stdin message on Stdout, upper-cased, until
// CloseStdin, then exits with the number of bytes it read.
func echo(c *wsstream.Conn) {
	n := 0
	for {
		ch, p, err := c.Recv()
		if err != nil {
			return
		}
		switch ch {
		case wsstream.Stdin:
			n += len(p)
			_ = c.Send(wsstream.Stdout, bytes.ToUpper(p))
		case wsstream.CloseStdin:
			_ = c.SendExit(wsstream.ExitStatus{ExitCode: n})
			// Read until the client answers the close.
			for {
				if _, _, err := c.Recv(); err != nil {
					return
				}
			}
		}
	}
}

// TestRelayPassesMessagesBothWaysAndEndsWithExit: a client talks through
// a relay (as the API relays to an agent) to an echoing server: its
// input arrives, large writes are split and come back whole, the Exit
// message is seen on its way and is the last; the relay ends cleanly.
func TestRelayPassesMessagesBothWaysAndEndsWithExit(t *testing.T) {
	var exit wsstream.ExitStatus
	relayDone := make(chan error, 1)
	client := serve(t, func(front *wsstream.Conn) {
		back := serve(t, echo)
		relayDone <- wsstream.Relay(front, back, func(ch byte, p []byte) {
			if ch == wsstream.Exit {
				_ = json.Unmarshal(p, &exit)
			}
		})
	})
	big := strings.Repeat("x", 3*wsstream.ChunkSize+5)
	if _, err := io.WriteString(client.Writer(wsstream.Stdin), "hello "+big); err != nil {
		t.Fatal(err)
	}
	if err := client.Send(wsstream.CloseStdin, nil); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	var last wsstream.ExitStatus
	for {
		ch, p, err := client.Recv()
		if err != nil {
			t.Fatalf("stream ended before its exit: %v (got %d bytes)", err, out.Len())
		}
		if ch == wsstream.Stdout {
			out.Write(p)
			continue
		}
		if ch != wsstream.Exit {
			t.Fatalf("unexpected channel %d", ch)
		}
		if err := json.Unmarshal(p, &last); err != nil {
			t.Fatal(err)
		}
		break
	}
	want := "HELLO " + strings.ToUpper(big)
	if out.String() != want || last.ExitCode != len("hello "+big) {
		t.Errorf("got %d bytes and exit %d; want %d bytes and exit %d", out.Len(), last.ExitCode, len(want), len("hello "+big))
	}
	if _, _, err := client.Recv(); err != io.EOF {
		t.Errorf("after Exit: %v, want io.EOF (a clean close)", err)
	}
	if err := <-relayDone; err != nil {
		t.Errorf("relay ended with %v, want a clean end", err)
	}
	if exit.ExitCode != last.ExitCode {
		t.Errorf("the relay saw exit %d, the client %d", exit.ExitCode, last.ExitCode)
	}
}

// TestRecvRefusesTextAndEmptyMessages: only binary messages with a
// channel byte are part of a stream.
func TestRecvRefusesTextAndEmptyMessages(t *testing.T) {
	for _, tc := range []struct {
		name string
		typ  int
		msg  []byte
	}{{"text", websocket.TextMessage, []byte("\x00hi")}, {"empty", websocket.BinaryMessage, nil}} {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan error, 1)
			client := serve(t, func(c *wsstream.Conn) {
				_, _, err := c.Recv()
				got <- err
			})
			if err := client.WS().WriteMessage(tc.typ, tc.msg); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err == nil {
				t.Errorf("Recv of a %s message: nil error", tc.name)
			}
		})
	}
}
