package api_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/internal/benchsum"
)

// benchWorkers is how many clients send requests at once.
const benchWorkers = 8

// benchMaxOps bounds every sub-benchmark's request count, whatever
// -benchtime asks, so `make bench` stays short; benchMinOps is the fewest
// a run takes, so its p99 rests on a thousand samples.
const (
	benchMaxOps = 20000
	benchMinOps = 1000
)

// benchBatch is how many requests one b.Loop iteration sends.
const benchBatch = 100

// BenchmarkAPILoopback measures create, get and list through the real
// router and a loopback HTTP connection on a real etcd (fsync on), with
// benchWorkers concurrent clients. It reports throughput (req/s) and the
// 50th and 99th percentile latency of one request, over at least
// benchMinOps requests a run; Go's own ns/op is per batch of benchBatch.
func BenchmarkAPILoopback(b *testing.B) {
	h := newBenchHarness(b)
	tok := h.token("bench")
	body, _ := json.Marshal(notebook())
	var ids []string
	var idsMu sync.Mutex
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchWorkers * 2}}
	send := func(method, path string, body []byte) (int, []byte, error) {
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		req, _ := http.NewRequest(method, h.srv.URL+path, rd)
		req.Header.Set("Authorization", "Bearer "+tok)
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	ops := map[string]func(i int) error{
		"create": func(int) error {
			code, b, err := send("POST", "/api/v1/sessions", body)
			if err != nil || code != http.StatusCreated {
				return fmt.Errorf("create: %d %v %s", code, err, b)
			}
			var v api.SessionView
			if err := json.Unmarshal(b, &v); err != nil {
				return err
			}
			idsMu.Lock()
			ids = append(ids, v.ID)
			idsMu.Unlock()
			return nil
		},
		"get": func(i int) error {
			idsMu.Lock()
			id := ids[i%len(ids)]
			idsMu.Unlock()
			code, b, err := send("GET", "/api/v1/sessions/"+id, nil)
			if err != nil || code != http.StatusOK {
				return fmt.Errorf("get: %d %v %s", code, err, b)
			}
			return nil
		},
		"list": func(int) error {
			code, b, err := send("GET", "/api/v1/sessions?limit=50", nil)
			if err != nil || code != http.StatusOK {
				return fmt.Errorf("list: %d %v %s", code, err, b)
			}
			return nil
		},
	}
	for _, name := range []string{"create", "get", "list"} {
		op := ops[name]
		b.Run(name, func(b *testing.B) {
			// b.Loop runs this function once a run (per -count) and
			// ramps the batches up to -benchtime inside it, so each run
			// adds one row to the summary: with b.N, each of Go's
			// ramp-up rounds (1 request, then 100…) added its own.
			var lat []time.Duration
			var busy time.Duration
			for b.Loop() {
				if n := min(benchBatch, benchMaxOps-len(lat)); n > 0 {
					l, took := runBatch(b, op, len(lat), n)
					lat, busy = append(lat, l...), busy+took
				}
			}
			// A p99 wants a thousand samples: a slow operation (a list
			// of 50) may not reach them in a second.
			for len(lat) < benchMinOps {
				l, took := runBatch(b, op, len(lat), min(benchBatch, benchMinOps-len(lat)))
				lat, busy = append(lat, l...), busy+took
			}
			rate := float64(len(lat)) / busy.Seconds()
			p50, p99 := benchsum.QuantileMS(lat, 0.5), benchsum.QuantileMS(lat, 0.99)
			b.ReportMetric(rate, "req/s")
			b.ReportMetric(p50, "p50-ms")
			b.ReportMetric(p99, "p99-ms")
			benchsum.Add(b, benchsum.Row{Figure: b.Name() + " throughput", Value: rate, Unit: "req/s"})
			benchsum.Add(b, benchsum.Row{Figure: b.Name() + " p99", Value: p99, Unit: "ms"})
		})
	}
}

// runBatch sends n requests through op (numbered from first) from
// benchWorkers clients at once and returns each one's latency and the
// batch's wall time. An error fails b.
func runBatch(b *testing.B, op func(i int) error, first, n int) ([]time.Duration, time.Duration) {
	b.Helper()
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var firstErr atomic.Value
	start := time.Now()
	var wg sync.WaitGroup
	for range benchWorkers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				t0 := time.Now()
				if err := op(first + i); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				lat[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	if err, _ := firstErr.Load().(error); err != nil {
		b.Fatal(err)
	}
	return lat, took
}
