package api_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/api/apitest"
	"github.com/voyager-gpu/voyager/internal/audit"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
)

const testSecret = "test-secret-0123456789abcdef-0123456789"

// harness is a real API on a real etcd behind a loopback HTTP server.
type harness struct {
	t      testing.TB
	cli    *clientv3.Client
	keys   state.Keys
	api    *api.API
	srv    *httptest.Server
	rsaKey *rsa.PrivateKey
	ecKey  *ecdsa.PrivateKey
	pemPub string // path of the PEM file with both public keys
}

type harnessOpts struct {
	rate     float64
	burst    int
	maxBody  int64
	audience string
	issuer   string
	// maxRuntime and maxRuntimeCap are the cluster's default max runtime
	// and its cap (api.Config).
	maxRuntime, maxRuntimeCap time.Duration
	// registries and maxQueued are api.Config's AllowedRegistries and
	// MaxQueuedPerUser.
	registries []string
	maxQueued  int
	// memlockKiB is api.Config's UlimitMemlockKiB (0: unlimited).
	memlockKiB int64
	// audit, when set, is api.Config's audit log.
	audit *audit.Log
	// powerDownAfter and now are api.Config's PowerDownAfter and Now.
	powerDownAfter time.Duration
	now            func() time.Time
	// usageHalfLife is api.Config's UsageHalfLife.
	usageHalfLife time.Duration
	// runtimeEstimates and plan are api.Config's RuntimeEstimates and
	// Plan.
	runtimeEstimates bool
	plan             placer.PlanOptions
}

func newHarness(t *testing.T, o harnessOpts) *harness {
	t.Helper()
	return startHarness(t, etcdtest.New(t), o)
}

// newBenchHarness is a harness on an etcd with fsync on, with no rate limit.
func newBenchHarness(b *testing.B) *harness {
	b.Helper()
	return startHarness(b, etcdtest.Start(b, etcdtest.Options{Fsync: true}).Client(b), harnessOpts{rate: 1e9, burst: 1 << 30})
}

func startHarness(t testing.TB, cli *clientv3.Client, o harnessOpts) *harness {
	t.Helper()
	h := &harness{t: t, cli: cli, keys: state.MustKeys(state.DefaultPrefix)}
	var err error
	if h.rsaKey, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		t.Fatal(err)
	}
	if h.ecKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	var pemBuf bytes.Buffer
	for _, pub := range []any{&h.rsaKey.PublicKey, &h.ecKey.PublicKey} {
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			t.Fatal(err)
		}
		_ = pem.Encode(&pemBuf, &pem.Block{Type: "PUBLIC KEY", Bytes: der})
	}
	h.pemPub = filepath.Join(t.TempDir(), "keys.pem")
	if err := os.WriteFile(h.pemPub, pemBuf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	keys, err := api.LoadPublicKeys(h.pemPub)
	if err != nil {
		t.Fatal(err)
	}
	if o.rate == 0 {
		o.rate, o.burst = 10000, 10000
	}
	if o.audience == "" {
		o.audience = "voyager"
	}
	a, err := api.New(cli, h.keys, api.Config{
		Auth: api.AuthConfig{
			HS256Secret: []byte(testSecret),
			PublicKeys:  keys,
			Audience:    o.audience,
			Issuer:      o.issuer,
		},
		Rate:              o.rate,
		Burst:             o.burst,
		MaxBodyBytes:      o.maxBody,
		MaxRuntime:        o.maxRuntime,
		MaxRuntimeCap:     o.maxRuntimeCap,
		AllowedRegistries: o.registries,
		MaxQueuedPerUser:  o.maxQueued,
		UlimitMemlockKiB:  o.memlockKiB,
		Audit:             o.audit,
		PowerDownAfter:    o.powerDownAfter,
		Now:               o.now,
		UsageHalfLife:     o.usageHalfLife,
		RuntimeEstimates:  o.runtimeEstimates,
		Plan:              o.plan,
		Logger:            slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	h.api = a
	apitest.Run(t, a)
	mux := http.NewServeMux()
	a.Mount(mux)
	h.srv = httptest.NewServer(mux)
	t.Cleanup(h.srv.Close)
	return h
}

// token mints an HS256 token for sub with roles, valid for an hour.
func (h *harness) token(sub string, roles ...string) string {
	return h.sign(jwt.SigningMethodHS256, []byte(testSecret), jwt.MapClaims{"sub": sub, "roles": roles, "aud": "voyager", "exp": time.Now().Add(time.Hour).Unix()})
}

func (h *harness) sign(m jwt.SigningMethod, key any, c jwt.MapClaims) string {
	h.t.Helper()
	s, err := jwt.NewWithClaims(m, c).SignedString(key)
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) problem(t *testing.T) api.Problem {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != api.ProblemContentType {
		t.Fatalf("Content-Type %q, want %s; body %s", ct, api.ProblemContentType, r.body)
	}
	var p api.Problem
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("decode problem: %v: %s", err, r.body)
	}
	return p
}

func (h *harness) do(method, path, token string, body any, headers ...string) response {
	h.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			h.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, h.srv.URL+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// want fails unless r has status code; it returns r for chaining.
func want(t *testing.T, r response, code int) response {
	t.Helper()
	if r.status != code {
		t.Fatalf("status %d, want %d; body: %s", r.status, code, r.body)
	}
	return r
}

func decode[T any](t *testing.T, r response) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("decode %T: %v: %s", v, err, r.body)
	}
	return v
}

// notebook is a small valid create request.
func notebook() map[string]any {
	return map[string]any{"kind": "notebook", "image": "voyager/jupyter:latest", "resources": map[string]any{"gpus": 1, "cpuMilli": 4000, "memoryMiB": 16384}}
}

// addNode registers a node with gpus GPUs of model.
func (h *harness) addNode(name, model string, gpus int) {
	h.t.Helper()
	n := state.Node{Name: name, Address: "10.0.0.1", CPUMilli: 64000, MemoryMiB: 512 * 1024, Ports: state.PortRange{First: 40000, Last: 40999}, Simulated: true, Registered: time.Now().UTC()}
	for i := 0; i < gpus; i++ {
		n.GPUs = append(n.GPUs, state.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", name, i), Model: model, MemoryMiB: 81920, Healthy: true})
	}
	if _, err := state.Put(context.Background(), h.cli, h.keys.Node(name), n); err != nil {
		h.t.Fatal(err)
	}
	h.waitFor("node "+name+" in the API's view", func() bool {
		r := h.do("GET", "/api/v1/nodes", h.token("root", "admin"), nil)
		return strings.Contains(string(r.body), `"name":"`+name+`"`)
	})
}

// waitFor polls cond until it holds (a cache catching up), failing after 10s.
func (h *harness) waitFor(what string, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, with a deadline
	}
}

func (h *harness) countKeys(prefix string) int64 {
	h.t.Helper()
	resp, err := h.cli.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		h.t.Fatal(err)
	}
	return resp.Count
}

func (h *harness) putStatus(st state.Status) {
	h.t.Helper()
	if _, err := state.Put(context.Background(), h.cli, h.keys.Status(st.Session), st); err != nil {
		h.t.Fatal(err)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// gather scrapes the API's collectors in the text format.
func gather(t *testing.T, a *api.API) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(a.Collectors()...)
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

// runPlacer runs a placer over cli with cfg (a tick of 200 ms and no logs
// unless set) until the test ends, and fails the test if it returns an
// error.
func runPlacer(t *testing.T, cli *clientv3.Client, cfg placer.Config) {
	t.Helper()
	if cfg.Tick == 0 {
		cfg.Tick = 200 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	pl := placer.New(cli, cfg)
	done := make(chan error, 1)
	go func() { done <- pl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("placer: %v", err)
		}
	})
}
