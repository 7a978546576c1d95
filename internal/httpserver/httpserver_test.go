package httpserver

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestServer(t *testing.T) {
	var (
		mu       sync.Mutex
		notReady error
	)
	mux := http.NewServeMux()
	Routes(mux, Probes{Ready: func(ctx context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		return notReady
	}})
	mux.HandleFunc("GET /extra", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("extra")) })

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := Listen("127.0.0.1:0", mux, log)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, 5*time.Second) }()

	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + s.Addr() + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	tests := []struct {
		name, path string
		notReady   error
		code       int
		body       string
	}{
		{"healthz", "/healthz", nil, 200, "ok"},
		{"readyz ready", "/readyz", nil, 200, "ok"},
		{"readyz not ready", "/readyz", errors.New("etcd down"), 503, "not ready: etcd down"},
		{"healthz while not ready", "/healthz", errors.New("etcd down"), 200, "ok"},
		{"metrics", "/metrics", nil, 200, "go_goroutines"},
		{"extra route", "/extra", nil, 200, "extra"},
		{"unknown", "/nope", nil, 404, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mu.Lock()
			notReady = tt.notReady
			mu.Unlock()
			code, body := get(tt.path)
			if code != tt.code || !strings.Contains(body, tt.body) {
				t.Errorf("GET %s = %d %q, want %d containing %q", tt.path, code, body, tt.code, tt.body)
			}
		})
	}

	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run after cancel = %v, want nil", err)
	}
	if _, err := net.Dial("tcp", s.Addr()); err == nil {
		t.Error("listener still accepts after shutdown")
	}
}

func TestListenBusy(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = Listen(l.Addr().String(), http.NewServeMux(), nil)
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("Listen on a busy port = %v, want EADDRINUSE", err)
	}
}
