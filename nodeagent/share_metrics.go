package nodeagent

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// shareCollector reports, per fraction of a shared GPU that the agent
// drives, its memory limit and compute share, and the MPS control daemons
// that run (per MIG device, the session GPU metrics already name the MIG
// device's UUID).
type shareCollector struct {
	a                     *Agent
	mem, compute, daemons *prometheus.Desc
}

func newShareCollector(a *Agent, node prometheus.Labels) *shareCollector {
	return &shareCollector{a: a,
		mem: sessionGPUDesc("voyager_agent_session_gpu_share_bytes",
			"Memory limit of each fraction of a shared GPU a session holds here (enforced by CUDA MPS; simulated=\"true\": nothing enforces it).", node),
		compute: sessionGPUDesc("voyager_agent_session_gpu_compute_share_ratio",
			"Compute share of each fraction of a shared GPU (1: no cap of its own).", node),
		daemons: prometheus.NewDesc("voyager_agent_mps_daemons",
			"CUDA MPS control daemons the agent runs, one per shared GPU holding fractions.", nil, node),
	}
}

func (c *shareCollector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch, c.mem, c.compute, c.daemons)
}

func (c *shareCollector) Collect(ch chan<- prometheus.Metric) {
	sim := strconv.FormatBool(c.a.cfg.Simulated)
	c.a.mu.Lock()
	for _, w := range c.a.workers {
		b := w.item.Value
		if b.Share == nil || len(b.GPUs) != 1 {
			continue
		}
		lv := []string{b.GPUs[0], b.Session, sim}
		ch <- prometheus.MustNewConstMetric(c.mem, prometheus.GaugeValue, float64(b.Share.MemoryMiB<<20), lv...)
		share := 1.0
		if b.Share.ComputePercent > 0 {
			share = float64(b.Share.ComputePercent) / 100
		}
		ch <- prometheus.MustNewConstMetric(c.compute, prometheus.GaugeValue, share, lv...)
	}
	c.a.mu.Unlock()
	n := 0
	if c.a.cfg.MPS != nil {
		n = len(c.a.cfg.MPS.Running())
	}
	ch <- prometheus.MustNewConstMetric(c.daemons, prometheus.GaugeValue, float64(n))
}
