package main

import (
	"fmt"
	"strings"

	"github.com/voyager-gpu/voyager/api"
)

// standingStrings are the HELD, FAIR SHARE and RECLAIM columns of `voyager
// team list` for a team's standing (GET /api/v1/teams' standing, the
// numbers the placers plan with): "6 (4 borrowed)" or "0 (owed 4)", its
// fair share down the tree, and the reclaims under way ("giving back 4
// GPUs (1 session)", "taking back 4 GPUs (1 session)"), "-" for none.
func standingStrings(s api.TeamStandingView) (held, fair, reclaim string) {
	if s.Team == "" {
		return "-", "-", "-"
	}
	held = fmt.Sprintf("%g", s.HeldGPUs)
	switch {
	case s.BorrowedGPUs > 0:
		held += fmt.Sprintf(" (%g borrowed)", s.BorrowedGPUs)
	case s.OwedGPUs > 0:
		held += fmt.Sprintf(" (owed %g)", s.OwedGPUs)
	}
	var parts []string
	if s.ReclaimedSessions > 0 {
		parts = append(parts, fmt.Sprintf("giving back %g GPUs (%s)", s.ReclaimedGPUs, plural(s.ReclaimedSessions, "session")))
	}
	if s.ReclaimingSessions > 0 {
		parts = append(parts, fmt.Sprintf("taking back %g GPUs (%s)", s.ReclaimingGPUs, plural(s.ReclaimingSessions, "session")))
	}
	reclaim = "-"
	if len(parts) > 0 {
		reclaim = strings.Join(parts, ", ")
	}
	return held, fmt.Sprintf("%g", s.FairShareGPUs), reclaim
}

// plural is "1 session", "2 sessions".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
