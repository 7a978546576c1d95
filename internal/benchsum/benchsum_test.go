package benchsum

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestAddAppendsRowsThatParseBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "summary")
	t.Setenv(Env, path)
	rows := []Row{
		{Figure: "placement", Value: 800, Unit: "bindings/s", Ceiling: 1000, CeilingName: "replay"},
		{Figure: "latency\tp99", Value: 12.5, Unit: "ms"},
	}
	for _, r := range rows {
		Add(t, r)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(got), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("summary file has %d lines, want 2:\n%s", len(lines), got)
	}
	rows[1].Figure = "latency p99" // a tab inside a field becomes a space
	for i, line := range lines {
		r, err := parse(line)
		if err != nil {
			t.Fatal(err)
		}
		if r != rows[i] {
			t.Errorf("line %d parsed as %+v, want %+v", i, r, rows[i])
		}
	}
}

func TestAddWithoutEnvWritesNothing(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(Env, "")
	t.Chdir(dir)
	Add(t, Row{Figure: "x", Value: 1, Unit: "u"})
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Fatalf("Add with %s unset wrote %v", Env, entries)
	}
}

func TestTableShowsMedianMinMaxAndRatioPerFigure(t *testing.T) {
	var in strings.Builder
	for _, r := range []Row{
		{Figure: "burst", Value: 800, Unit: "b/s", Ceiling: 1000, CeilingName: "replay"},
		{Figure: "p99", Value: 12.5, Unit: "ms"},
		{Figure: "burst", Value: 300, Unit: "b/s", Ceiling: 1200, CeilingName: "replay"},
		{Figure: "burst", Value: 900, Unit: "b/s", Ceiling: 1000, CeilingName: "replay"},
	} {
		in.WriteString(r.Format())
	}
	got, err := Table("title", []byte(in.String()))
	if err != nil {
		t.Fatal(err)
	}
	want := "title\n" +
		"figure  value                      ceiling or floor (same run)           value/ceiling\n" +
		"burst   800 b/s (300–900, 3 runs)  1000 b/s (1000–1200, 3 runs): replay  0.8 (0.25–0.9, 3 runs)\n" +
		"p99     12.5 ms                    -                                     -\n"
	if got != want {
		t.Fatalf("table:\n%s\nwant\n%s", got, want)
	}
}

func TestTableShowsWhyAFigureWasSkipped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "summary")
	t.Setenv(Env, path)
	Skip(t, "jupyter p50", "no image: run make image")
	Add(t, Row{Figure: "busybox p50", Value: 5, Unit: "ms"})
	Skip(t, "busybox p50", "not this time") // a figure measured in another run shows its values
	summary, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Table("title", summary)
	if err != nil {
		t.Fatal(err)
	}
	want := "title\n" +
		"figure       value                              ceiling or floor (same run)  value/ceiling\n" +
		"jupyter p50  skipped: no image: run make image  -                            -\n" +
		"busybox p50  5 ms                               -                            -\n"
	if got != want {
		t.Fatalf("table:\n%s\nwant\n%s", got, want)
	}
}

func TestTableRefusesAMalformedLine(t *testing.T) {
	if _, err := Table("t", []byte("just a figure\n")); err == nil || !strings.Contains(err.Error(), "want 5 tab-separated fields") {
		t.Fatalf("Table of a malformed line: err %v, want one naming the 5 fields", err)
	}
}

func TestQuantileMSIsTheNearestRank(t *testing.T) {
	var lat []time.Duration
	for i := 100; i >= 1; i-- { // unsorted, and left so
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct{ p, want float64 }{{0.5, 50}, {0.99, 99}, {0.999, 100}, {0, 1}} {
		if got := QuantileMS(lat, c.p); got != c.want {
			t.Errorf("QuantileMS(1..100 ms, %v) = %v, want %v", c.p, got, c.want)
		}
	}
	if lat[0] != 100*time.Millisecond {
		t.Errorf("QuantileMS sorted its argument: the first sample is now %s", lat[0])
	}
	if got := QuantileMS(nil, 0.5); !math.IsNaN(got) {
		t.Errorf("QuantileMS(no samples) = %v, want NaN", got)
	}
}
