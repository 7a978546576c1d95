package etcdhealth_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdembed"
	"github.com/voyager-gpu/voyager/internal/etcdhealth"
	"github.com/voyager-gpu/voyager/internal/httpserver"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestNoSpaceAlarmInReadyzAndMetrics fills a real embedded etcd with a
// 1 MiB quota until it raises NOSPACE and refuses writes: /readyz then
// answers 503 naming the alarm and what to do, and /metrics reports
// voyager_etcd_alarm{alarm="NOSPACE"} 1. The documented recovery (delete,
// compact, defragment, disarm) makes it ready again.
func TestNoSpaceAlarmInReadyzAndMetrics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := etcdembed.Start(ctx, etcdembed.Config{Dir: t.TempDir(), NoFsync: true, QuotaBytes: 1 << 20, LogLevel: "fatal"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cli, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	reg := httpserver.NewRegistry()
	reg.MustRegister(etcdhealth.NewCollector(cli))
	mux := http.NewServeMux()
	httpserver.Routes(mux, httpserver.Probes{Ready: etcdhealth.Ready(cli, "/voyager"), Gatherer: reg})
	hs := httptest.NewServer(mux)
	defer hs.Close()

	if code, body := get(t, hs.URL+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz before = %d %q; want 200", code, body)
	}
	if _, body := get(t, hs.URL+"/metrics"); !strings.Contains(body, `voyager_etcd_alarm{alarm="NOSPACE"} 0`) ||
		!strings.Contains(body, "voyager_etcd_up 1") || !strings.Contains(body, "voyager_etcd_db_size_bytes{endpoint=") {
		t.Fatalf("/metrics before lacks the etcd gauges:\n%s", grep(body, "voyager_etcd"))
	}

	value := strings.Repeat("x", 64<<10)
	var werr error
	for i := 0; i < 1000 && werr == nil; i++ {
		_, werr = cli.Put(ctx, fmt.Sprintf("/voyager/fill/%04d", i), value)
	}
	if !errors.Is(werr, rpctypes.ErrNoSpace) {
		t.Fatalf("writes past the quota: %v; want %v", werr, rpctypes.ErrNoSpace)
	}

	code, body := get(t, hs.URL+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "NOSPACE") || !strings.Contains(body, "etcdctl alarm disarm") {
		t.Fatalf("/readyz with NOSPACE = %d %q; want 503 naming the alarm and the way out", code, body)
	}
	if _, body := get(t, hs.URL+"/metrics"); !strings.Contains(body, `voyager_etcd_alarm{alarm="NOSPACE"} 1`) ||
		!strings.Contains(body, `voyager_etcd_alarm{alarm="CORRUPT"} 0`) {
		t.Fatalf("/metrics with NOSPACE:\n%s", grep(body, "voyager_etcd"))
	}

	// The way out, as docs/architecture.md tells it.
	del, err := cli.Delete(ctx, "/voyager/fill/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, del.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Defragment(ctx, srv.Endpoint()); err != nil {
		t.Fatal(err)
	}
	alarms, err := cli.AlarmList(ctx) // as etcdctl alarm disarm does
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range alarms.Alarms {
		if _, err := cli.AlarmDisarm(ctx, (*clientv3.AlarmMember)(a)); err != nil {
			t.Fatal(err)
		}
	}
	if code, body := get(t, hs.URL+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz after recovery = %d %q; want 200", code, body)
	}
	if _, err := cli.Put(ctx, "/voyager/after", "ok"); err != nil {
		t.Fatalf("write after recovery: %v", err)
	}
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
