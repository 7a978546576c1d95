package main

import (
	"strings"
	"testing"

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
