package benchsum

import (
	"os"
	"path/filepath"
	"testing"
)

func TestAddAppendsRowsWithRatio(t *testing.T) {
	path := filepath.Join(t.TempDir(), "summary")
	t.Setenv(Env, path)
	Add(t, Row{Figure: "placement", Value: 800, Unit: "bindings/s", Ceiling: 1000, CeilingName: "replay"})
	Add(t, Row{Figure: "latency p99", Value: 12.5, Unit: "ms"})
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := "placement\t800 bindings/s\t1000 bindings/s (replay)\t0.80\n" +
		"latency p99\t12.5 ms\t-\t-\n"
	if string(got) != want {
		t.Fatalf("summary file:\n%q\nwant\n%q", got, want)
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

func TestTableAlignsRowsUnderHeader(t *testing.T) {
	got := Table("title", []byte(Row{Figure: "a", Value: 1, Unit: "u", Ceiling: 2, CeilingName: "c"}.Format()+
		Row{Figure: "longer figure", Value: 3, Unit: "ms"}.Format()))
	want := "title\n" +
		"figure         value  ceiling or floor (same run)  value/ceiling\n" +
		"a              1 u    2 u (c)                      0.50\n" +
		"longer figure  3 ms   -                            -\n"
	if got != want {
		t.Fatalf("table:\n%s\nwant\n%s", got, want)
	}
}
