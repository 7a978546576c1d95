package api_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
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
// -benchtime asks, so `make bench` stays short.
const benchMaxOps = 20000

// BenchmarkAPILoopback measures create, get and list through the real
// router and a loopback HTTP connection on a real etcd (fsync on), with
// benchWorkers concurrent clients. It reports throughput (req/s) and the
// 50th and 99th percentile latency of one request.
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
			n := min(b.N, benchMaxOps)
			lat := make([]time.Duration, n)
			var next atomic.Int64
			var firstErr atomic.Value
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for w := 0; w < benchWorkers; w++ {
				wg.Go(func() {
					for {
						i := int(next.Add(1)) - 1
						if i >= n {
							return
						}
						t0 := time.Now()
						if err := op(i); err != nil {
							firstErr.CompareAndSwap(nil, err)
							return
						}
						lat[i] = time.Since(t0)
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			if err, _ := firstErr.Load().(error); err != nil {
				b.Fatal(err)
			}
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			b.ReportMetric(float64(n)/elapsed.Seconds(), "req/s")
			b.ReportMetric(float64(lat[n/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[(n*99)/100].Microseconds())/1000, "p99-ms")
			benchsum.Add(b, benchsum.Row{Figure: b.Name() + " throughput", Value: float64(n) / elapsed.Seconds(), Unit: "req/s"})
			benchsum.Add(b, benchsum.Row{Figure: b.Name() + " p99", Value: float64(lat[(n*99)/100].Microseconds()) / 1000, Unit: "ms"})
		})
	}
}
