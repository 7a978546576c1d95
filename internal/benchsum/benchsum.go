package benchsum

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"text/tabwriter"
)

// Env names the file rows are appended to; with it unset, Add does nothing.
const Env = "BENCH_SUMMARY"

// Row is one figure of the summary table.
type Row struct {
	// Figure names what was measured, for example "placement 1 placer binpack".
	Figure string
	// Value and Unit are the measured figure.
	Value float64
	Unit  string
	// Ceiling is the reference measured in the same run: for a rate, the
	// best the same work reached without the part measured; for a latency
	// or a cost, the floor beneath it (0: none measured). CeilingName says
	// what it was.
	Ceiling     float64
	CeilingName string
}

// Format renders r as one tab-separated line: figure, value, ceiling,
// ratio of value to ceiling ("-" where there is no ceiling).
func (r Row) Format() string {
	ceiling, ratio := "-", "-"
	if r.Ceiling > 0 {
		ceiling = fmt.Sprintf("%.4g %s (%s)", r.Ceiling, r.Unit, r.CeilingName)
		ratio = fmt.Sprintf("%.2f", r.Value/r.Ceiling)
	}
	return strings.Join([]string{r.Figure, fmt.Sprintf("%.4g %s", r.Value, r.Unit), ceiling, ratio}, "\t") + "\n"
}

// Add appends r to the summary file named by $BENCH_SUMMARY, if set. A
// failure to write fails tb.
func Add(tb testing.TB, r Row) {
	tb.Helper()
	path := os.Getenv(Env)
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		tb.Fatalf("open bench summary: %v", err)
	}
	if _, err := f.WriteString(r.Format()); err != nil {
		_ = f.Close()
		tb.Fatalf("write bench summary: %v", err)
	}
	if err := f.Close(); err != nil {
		tb.Fatalf("close bench summary: %v", err)
	}
}

// Table renders the rows of a summary file (as Add writes them) as one
// aligned table with a header, under a title line.
func Table(title string, summary []byte) string {
	var sb strings.Builder
	sb.WriteString(title + "\n")
	tw := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "figure\tvalue\tceiling or floor (same run)\tvalue/ceiling\n")
	for _, line := range strings.Split(strings.TrimRight(string(summary), "\n"), "\n") {
		if line != "" {
			fmt.Fprintln(tw, line)
		}
	}
	_ = tw.Flush() // a strings.Builder does not fail
	return sb.String()
}
