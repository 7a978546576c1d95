package main

import (
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/api"
)

// TestNodeRowCountsUnhealthyGPUs: `voyager node list` says how many GPUs
// the node offers as unhealthy, beside its state.
func TestNodeRowCountsUnhealthyGPUs(t *testing.T) {
	l := nodeListing(nil)
	n := api.NodeSummary{Name: "gpu-1", GPUs: api.GPUCounts{Total: 7, Free: 7, Unhealthy: 1}}
	if row := l.row(n, false); !strings.HasSuffix(row, "\tready, 1 GPU(s) unhealthy") {
		t.Errorf("row %q, want its status to count the unhealthy GPU", row)
	}
	n.GPUs.Unhealthy = 0
	if row := l.row(n, false); !strings.HasSuffix(row, "\tready") {
		t.Errorf("row %q, want plain ready", row)
	}
}

// TestNodeRowSaysHowLongANodeWasEmpty: `voyager node list` shows how long
// an empty node has run nothing and marks one that may power down; a node
// in use shows "-".
func TestNodeRowSaysHowLongANodeWasEmpty(t *testing.T) {
	l := nodeListing(nil)
	since := time.Date(2026, 11, 29, 3, 0, 0, 0, time.UTC)
	n := api.NodeSummary{Name: "gpu-1", GPUs: api.GPUCounts{Total: 8, Free: 8}, NodePower: api.NodePower{EmptySince: &since, EmptyFor: "1h5m0s", PowerDown: true}}
	if row := l.row(n, false); !strings.Contains(row, "\t1h5m0s (power down)\tready") {
		t.Errorf("row %q, want how long it was empty, marked power down", row)
	}
	if row := l.row(n, true); !strings.Contains(row, "\t2026-11-29T03:00:00Z\t") {
		t.Errorf("wide row %q, want the time it emptied", row)
	}
	n.PowerDown = false
	if row := l.row(n, false); !strings.Contains(row, "\t1h5m0s\tready") {
		t.Errorf("row %q, want how long it was empty, unmarked", row)
	}
	n.NodePower = api.NodePower{}
	if row := l.row(n, false); !strings.Contains(row, "\t-\tready") {
		t.Errorf("row %q, want - for a node in use", row)
	}
}
