package console

import (
	"fmt"
	"html"
	"html/template"
	"strings"
	"time"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// funcs are the templates' helpers; now is the console's clock.
func funcs(now func() time.Time) template.FuncMap {
	return template.FuncMap{
		"short": shortModel,
		"ago": func(t time.Time) string {
			if t.IsZero() {
				return ""
			}
			return roundDur(now().Sub(t))
		},
		"when": func(t *time.Time) string {
			if t == nil || t.IsZero() {
				return ""
			}
			return t.UTC().Format("2006-01-02 15:04 UTC")
		},
		"whenT": func(t time.Time) string {
			if t.IsZero() {
				return ""
			}
			return t.UTC().Format("2006-01-02 15:04 UTC")
		},
		"hours":    func(h float64) string { return fmt.Sprintf("%.2f", h) },
		"terminal": func(p state.Phase) bool { return p.Terminal() },
		"lower":    strings.ToLower,
		"join":     strings.Join,
		"gib":      gib,
		"tiles":    gpuTiles,
		"deref": func(p *int64) string {
			if p == nil {
				return "unlimited"
			}
			return fmt.Sprint(*p)
		},
		"exit": func(p *int) string {
			if p == nil {
				return "—"
			}
			return fmt.Sprint(*p)
		},
	}
}

// roundDur writes a duration as people read a wait: 45s, 12m, 3h05m, 2d4h.
func roundDur(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}

// gpuTiles writes a node's devices as the cluster page's tiles. It is Go,
// not template actions, because a large cluster has thousands of tiles
// and each template action costs an escaper call (BenchmarkClusterPage):
// every string that came from the API goes through html.EscapeString.
func gpuTiles(devices []api.GPUDevice) template.HTML {
	var b strings.Builder
	b.WriteString(`<ul class="gpus">`)
	for _, d := range devices {
		class, state := "free", "free"
		switch {
		case !d.Healthy:
			class, state = "sick", "unhealthy"
		case d.Owner != "":
			class, state = "held", ""
			if d.Unused {
				class = "held unused"
			}
		}
		title := ""
		if !d.Healthy && d.Problem != "" {
			title = ` title="` + html.EscapeString(d.Problem) + `"`
		}
		fmt.Fprintf(&b, `<li class="gpu %s"%s>#%d`, class, title, d.Index)
		if d.MIGProfile != "" {
			b.WriteString("/" + html.EscapeString(d.MIGProfile))
		}
		b.WriteString(" " + html.EscapeString(shortModel(d.Model)) + " " + gib(d.MemoryMiB))
		if d.Owner != "" {
			b.WriteString(" · " + html.EscapeString(d.Owner))
			if d.Session != "" {
				b.WriteString("/" + html.EscapeString(d.Session))
			}
			if d.Sampled {
				fmt.Fprintf(&b, " · %d%% %d MiB", d.UtilizationPercent, d.MemoryUsedMiB)
			}
			if d.Unused {
				b.WriteString(" · UNUSED")
			}
		} else {
			b.WriteString(" · " + state)
		}
		if d.Simulated {
			b.WriteString(" · sim")
		}
		b.WriteString("</li>")
	}
	b.WriteString("</ul>")
	return template.HTML(b.String()) //nolint:gosec // every value above is escaped or a number
}

// gib writes MiB as GiB.
func gib(mib int64) string {
	if mib%1024 == 0 {
		return fmt.Sprintf("%d GiB", mib/1024)
	}
	return fmt.Sprintf("%.1f GiB", float64(mib)/1024)
}
