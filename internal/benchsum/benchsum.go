package benchsum

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"
)

// Env names the file rows are appended to; with it unset, Add does nothing.
const Env = "BENCH_SUMMARY"

// Row is one figure of the summary table, from one run.
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
	// Skipped, when set, says why the figure was not measured in this run
	// and what would measure it (for example "no image: run make image");
	// the row then carries no value, and the table shows the reason where
	// no run measured the figure.
	Skipped string
}

// Format renders r as one line of the summary file: figure, value, unit,
// ceiling and ceiling name, tab-separated, and a sixth field, the reason,
// for a skipped row.
func (r Row) Format() string {
	clean := func(s string) string { return strings.NewReplacer("\t", " ", "\n", " ").Replace(s) }
	f := []string{clean(r.Figure), strconv.FormatFloat(r.Value, 'g', -1, 64), clean(r.Unit),
		strconv.FormatFloat(r.Ceiling, 'g', -1, 64), clean(r.CeilingName)}
	if r.Skipped != "" {
		f = append(f, clean(r.Skipped))
	}
	return strings.Join(f, "\t") + "\n"
}

// parse reads a line that Format wrote.
func parse(line string) (Row, error) {
	f := strings.Split(line, "\t")
	if len(f) != 5 && len(f) != 6 {
		return Row{}, fmt.Errorf("parse bench summary line %q: want 5 tab-separated fields (figure, value, unit, ceiling, ceiling name) and, for a skipped figure, a sixth (why), got %d", line, len(f))
	}
	if len(f) == 6 {
		return Row{Figure: f[0], Unit: f[2], CeilingName: f[4], Skipped: f[5]}, nil
	}
	v, err := strconv.ParseFloat(f[1], 64)
	if err != nil {
		return Row{}, fmt.Errorf("parse bench summary value %q: %w", f[1], err)
	}
	c, err := strconv.ParseFloat(f[3], 64)
	if err != nil {
		return Row{}, fmt.Errorf("parse bench summary ceiling %q: %w", f[3], err)
	}
	return Row{Figure: f[0], Value: v, Unit: f[2], Ceiling: c, CeilingName: f[4]}, nil
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

// Skip appends a row saying that figure was not measured in this run, and
// why (with what would measure it), and logs the reason on tb: a figure
// never silently disappears from the table.
func Skip(tb testing.TB, figure, why string) {
	tb.Helper()
	tb.Logf("NOT MEASURED: %s: %s", figure, why)
	Add(tb, Row{Figure: figure, Skipped: why})
}

// num renders v with no more digits than a noisy benchmark earns.
func num(v float64) string {
	if v >= 100 || v <= -100 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// spread renders the median of vs, with min–max and the count of runs
// when there is more than one.
func spread(vs []float64, unit string) string {
	slices.Sort(vs)
	med := vs[len(vs)/2]
	if len(vs)%2 == 0 {
		med = (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
	}
	s := num(med)
	if unit != "" {
		s += " " + unit
	}
	if len(vs) > 1 {
		s += fmt.Sprintf(" (%s–%s, %d runs)", num(vs[0]), num(vs[len(vs)-1]), len(vs))
	}
	return s
}

// Table renders a summary file (as Add writes it) as one aligned table
// under a title line: one row per figure, in the order figures first
// appear. A figure measured in several runs shows the median with min–max
// of its value, of its ceiling and of the per-run ratio value/ceiling.
func Table(title string, summary []byte) (string, error) {
	type agg struct {
		unit, ceilingName   string
		skipped             string
		vals, ceils, ratios []float64
	}
	var order []string
	figs := map[string]*agg{}
	for _, line := range strings.Split(strings.TrimRight(string(summary), "\n"), "\n") {
		if line == "" {
			continue
		}
		r, err := parse(line)
		if err != nil {
			return "", err
		}
		a, ok := figs[r.Figure]
		if !ok {
			a = &agg{unit: r.Unit, ceilingName: r.CeilingName}
			figs[r.Figure] = a
			order = append(order, r.Figure)
		}
		if r.Skipped != "" {
			a.skipped = r.Skipped
			continue
		}
		a.vals = append(a.vals, r.Value)
		if r.Ceiling > 0 {
			a.ceils = append(a.ceils, r.Ceiling)
			a.ratios = append(a.ratios, r.Value/r.Ceiling)
		}
	}
	var sb strings.Builder
	sb.WriteString(title + "\n")
	tw := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "figure\tvalue\tceiling or floor (same run)\tvalue/ceiling\n")
	for _, f := range order {
		a := figs[f]
		if len(a.vals) == 0 {
			fmt.Fprintf(tw, "%s\tskipped: %s\t-\t-\n", f, a.skipped)
			continue
		}
		ceiling, ratio := "-", "-"
		if len(a.ceils) > 0 {
			ceiling = spread(a.ceils, a.unit) + ": " + a.ceilingName
			ratio = spread(a.ratios, "")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f, spread(a.vals, a.unit), ceiling, ratio)
	}
	_ = tw.Flush() // a strings.Builder does not fail
	return sb.String(), nil
}

// QuantileMS is the p-quantile of lat (nearest rank) in milliseconds, NaN
// for no samples. lat is left as it was.
func QuantileMS(lat []time.Duration, p float64) float64 {
	if len(lat) == 0 {
		return math.NaN()
	}
	lat = slices.Clone(lat)
	slices.Sort(lat)
	i := int(math.Ceil(p*float64(len(lat)))) - 1
	return float64(lat[max(0, i)].Microseconds()) / 1000
}

// ProcessCPU is the user and system CPU time this process has used so
// far. It fails tb if the kernel does not say. It is one system call (no
// tb.Helper, which costs more): benchmarks read it at every event they
// count.
func ProcessCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
