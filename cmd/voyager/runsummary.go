package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// RunSummary is what voyager run prints when a batch job ends: one line on
// stderr, or with -o json this object alone on stdout.
type RunSummary struct {
	Session string      `json:"session"`
	Phase   state.Phase `json:"phase"`
	// Nodes are the machines the job ran on (its last attempt).
	Nodes []string `json:"nodes"`
	// GPUs is the job's GPUs on all its nodes together.
	GPUs     int        `json:"gpus"`
	Created  time.Time  `json:"created"`
	Started  *time.Time `json:"started,omitempty"`
	Finished *time.Time `json:"finished,omitempty"`
	// WallSeconds is from the start of its last attempt to its end.
	WallSeconds float64 `json:"wallSeconds"`
	// GPUShare is the fraction of a GPU each node's part held, for a
	// fraction of a shared GPU (its memory's share of the GPU, or its
	// compute percent where larger); absent for whole GPUs.
	GPUShare float64 `json:"gpuShare,omitempty"`
	// GPUHours is GPUs × wall time in hours (a fraction counts as its
	// share of a GPU).
	GPUHours float64 `json:"gpuHours"`
	ExitCode *int    `json:"exitCode,omitempty"`
	Attempt  int     `json:"attempt"`
}

// summarize builds the summary of a job from its spec and final status.
func summarize(s state.Session, st state.Status) RunSummary {
	nodes := max(1, len(st.Nodes))
	sum := RunSummary{Session: s.ID, Phase: st.Phase, Nodes: st.Nodes, GPUs: s.Resources.GPUs * nodes,
		Created: s.Created, Started: st.Started, Finished: st.Finished, ExitCode: st.ExitCode, Attempt: st.Attempt}
	if sum.Nodes == nil {
		sum.Nodes = []string{}
	}
	if el := st.Elastic; el != nil && el.Size > 0 {
		sum.GPUs = el.Size * nodes // an elastic job's last attempt, at the size it was bound at
	}
	if st.Started != nil && st.Finished != nil && st.Finished.After(*st.Started) {
		wall := st.Finished.Sub(*st.Started)
		sum.WallSeconds = wall.Seconds()
		sum.GPUHours = float64(sum.GPUs) * wall.Hours()
	}
	if sh := st.GPUShare; sh != nil {
		sum.GPUShare = float64(sh.MilliGPUs()) / 1000
		sum.GPUHours = sum.GPUShare * float64(nodes) * sum.WallSeconds / 3600
	}
	return sum
}

// line is the summary as one line: session, phase, nodes, GPUs, wall time,
// GPU-hours, exit code.
func (r RunSummary) line() string {
	nodes := "-"
	if len(r.Nodes) > 0 {
		nodes = strings.Join(r.Nodes, ",")
	}
	exit := "-"
	if r.ExitCode != nil {
		exit = itoa(*r.ExitCode)
	}
	wall := (time.Duration(r.WallSeconds * float64(time.Second))).Round(100 * time.Millisecond)
	gpus := fmt.Sprintf("%d GPU(s)", r.GPUs)
	if r.GPUShare > 0 {
		gpus = fmt.Sprintf("%g of a shared GPU", r.GPUShare)
	}
	return fmt.Sprintf("%s %s on %s, %s, wall %s, %.3f GPU-hours, exit %s", r.Session, r.Phase, nodes, gpus, wall, r.GPUHours, exit)
}

// report prints the summary of a finished job: as JSON on stdout, or as
// a progress line.
func (r RunSummary) report(asJSON bool, stdout io.Writer, progress func(string, ...any)) {
	if asJSON {
		_ = writeJSON(stdout, r)
		return
	}
	progress("%s", r.line())
}
