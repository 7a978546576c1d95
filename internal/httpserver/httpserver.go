package httpserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ReadyFunc reports whether the process can serve: nil when ready, else
// why not. It is called per /readyz request with a context bounded by
// Probes.ReadyTimeout.
type ReadyFunc func(ctx context.Context) error

// Probes configures the operational routes.
type Probes struct {
	// Ready backs /readyz. Nil means always ready.
	Ready ReadyFunc
	// ReadyTimeout bounds one Ready call. Zero means 2 seconds.
	ReadyTimeout time.Duration
	// Gatherer backs /metrics. Nil means NewRegistry().
	Gatherer prometheus.Gatherer
}

// NewRegistry returns a fresh Prometheus registry holding the Go runtime and
// process collectors; components register their own metrics on it.
func NewRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return r
}

// Routes adds /healthz, /readyz and /metrics to mux.
//
// /healthz answers 200 while the process runs. /readyz answers 200 when
// p.Ready returns nil within p.ReadyTimeout, else 503 with the reason.
func Routes(mux *http.ServeMux, p Probes) {
	timeout := p.ReadyTimeout
	if timeout == 0 {
		timeout = 2 * time.Second
	}
	gatherer := p.Gatherer
	if gatherer == nil {
		gatherer = NewRegistry()
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if p.Ready != nil {
			ctx, cancel := context.WithTimeout(r.Context(), timeout)
			defer cancel()
			if err := p.Ready(ctx); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = fmt.Fprintf(w, "not ready: %v\n", err)
				return
			}
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
}

// Server is an HTTP server bound to its address.
type Server struct {
	ln  net.Listener
	srv *http.Server
}

// Listen binds addr now, so that a busy port is reported before anything
// claims to be ready, and returns a Server that serves h once Serve is
// called. Errors go to log (nil means slog.Default()).
func Listen(addr string, h http.Handler, log *slog.Logger) (*Server, error) {
	return ListenTLS(addr, h, nil, log)
}

// ListenTLS is Listen serving HTTPS with tc; a nil tc serves plain HTTP.
func ListenTLS(addr string, h http.Handler, tc *tls.Config, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.Default()
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen http: %w", err)
	}
	if tc != nil {
		ln = tls.NewListener(ln, tc)
	}
	return &Server{
		ln: ln,
		srv: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
	}, nil
}

// Addr is the bound address, with the actual port when addr's port was 0.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve serves until Shutdown; it then returns nil. Any other return is a
// failure of the listener.
func (s *Server) Serve() error {
	if err := s.srv.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve http: %w", err)
	}
	return nil
}

// Shutdown stops accepting connections and waits for active requests until
// ctx ends, then closes what is left.
func (s *Server) Shutdown(ctx context.Context) error {
	if err := s.srv.Shutdown(ctx); err != nil {
		_ = s.srv.Close()
		return fmt.Errorf("shut down http: %w", err)
	}
	return nil
}

// Run serves until ctx ends, then shuts down gracefully within
// shutdownTimeout. It returns nil after a clean shutdown: the shape of a
// component that a supervisor runs.
func (s *Server) Run(ctx context.Context, shutdownTimeout time.Duration) error {
	served := make(chan error, 1)
	go func() { served <- s.Serve() }()
	select {
	case err := <-served:
		if err == nil {
			err = errors.New("serve http: stopped unexpectedly")
		}
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	err := s.Shutdown(sctx)
	if serr := <-served; err == nil {
		err = serr
	}
	return err
}
