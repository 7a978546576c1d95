package console

import (
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/api"
)

// TestGPUTilesSayWhyAGPUIsUnhealthy: an unhealthy GPU's tile carries the
// agent's problem as its title (escaped); a healthy one has none.
func TestGPUTilesSayWhyAGPUIsUnhealthy(t *testing.T) {
	out := string(gpuTiles([]api.GPUDevice{
		{Index: 0, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, Healthy: true},
		{Index: 1, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, Problem: `no CDI device nvidia.com/gpu=GPU-1 in /etc/cdi: run "nvidia-ctk cdi generate" <then restart>`},
	}))
	want := `<li class="gpu sick" title="no CDI device nvidia.com/gpu=GPU-1 in /etc/cdi: run &#34;nvidia-ctk cdi generate&#34; &lt;then restart&gt;">#1`
	if !strings.Contains(out, want) {
		t.Errorf("tiles\n%s\nwant the unhealthy one as\n%s", out, want)
	}
	if !strings.Contains(out, `<li class="gpu free">#0`) {
		t.Errorf("tiles\n%s\nwant the healthy one without a title", out)
	}
}
