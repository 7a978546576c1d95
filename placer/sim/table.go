package sim

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Row is one run for Table: its strategy and seed, and what it measured.
type Row struct {
	Strategy string
	Seed     uint64
	Result   Result
}

// Table writes rows as a Markdown table: Jain's index, the flooding user's
// share (user "flood"), queueing time mean/p99 in minutes for 1- and
// 8-GPU requests, utilisation while work waits, idle GPUs held and
// fragmented, the fraction of passes that left work waiting, and 8-GPU
// slots free against floor(free GPUs / 8).
func Table(rows []Row) string {
	var b strings.Builder
	b.WriteString("| strategy | seed | sessions | Jain | shares | wait 1-GPU mean/p99 (min) | wait 8-GPU mean/p99 (min) | p99 8/1 | util while waiting | idle held | idle fragmented | queued | 8-GPU slots / floor(free/8) | NewPlan p50/p99 |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		res := r.Result
		one, eight := res.Wait["1"], res.Wait["8"]
		ratio := 0.0
		if one.P99 > 0 {
			ratio = eight.P99 / one.P99
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %.3f | %s | %.0f / %.0f | %.0f / %.0f | %.2f | %.1f%% | %.1f%% | %.1f%% | %.0f%% | %.2f / %.2f | %v / %v |\n",
			r.Strategy, r.Seed, res.Sessions, res.Jain, sharesCell(res.Share), one.Mean, one.P99, eight.Mean, eight.P99, ratio,
			100*res.Util, 100*res.IdleHeld, 100*res.IdleFragmented, 100*res.QueuedFraction, res.Slots8, res.Floor8,
			res.PlanP50.Round(10*1000), res.PlanP99.Round(10*1000))
	}
	return b.String()
}

// sharesCell is a table's shares cell: each user's share of the GPUs in
// percent, users in name order ("ada 50%, bob 50%").
func sharesCell(share map[string]float64) string {
	var cells []string
	for _, u := range slices.Sorted(maps.Keys(share)) {
		cells = append(cells, fmt.Sprintf("%s %.0f%%", u, 100*share[u]))
	}
	return strings.Join(cells, ", ")
}
