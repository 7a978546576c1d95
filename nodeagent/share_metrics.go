package nodeagent

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// shareLabels label a fraction of a shared GPU in the metrics.
var shareLabels = []string{"gpu", "session", "simulated"}

// shareCollector reports, per fraction of a shared GPU that the agent
// drives, its memory limit and compute share, and the MPS control daemons
// that run (per MIG device, the session GPU metrics already name the MIG
// device's UUID).
type shareCollector struct {
	a      *Agent
	labels prometheus.Labels
}

func (c *shareCollector) descs() (mem, compute, daemons *prometheus.Desc) {
	return prometheus.NewDesc("voyager_agent_session_gpu_share_bytes",
			"Memory limit of each fraction of a shared GPU a session holds here (enforced by CUDA MPS; simulated=\"true\": nothing enforces it).", shareLabels, c.labels),
		prometheus.NewDesc("voyager_agent_session_gpu_compute_share_ratio",
			"Compute share of each fraction of a shared GPU (1: no cap of its own).", shareLabels, c.labels),
		prometheus.NewDesc("voyager_agent_mps_daemons",
			"CUDA MPS control daemons the agent runs, one per shared GPU holding fractions.", nil, c.labels)
}

func (c *shareCollector) Describe(ch chan<- *prometheus.Desc) {
	m, p, d := c.descs()
	ch <- m
	ch <- p
	ch <- d
}

func (c *shareCollector) Collect(ch chan<- prometheus.Metric) {
	mem, compute, daemons := c.descs()
	sim := strconv.FormatBool(c.a.cfg.Simulated)
	c.a.mu.Lock()
	for _, w := range c.a.workers {
		b := w.item.Value
		if b.Share == nil || len(b.GPUs) != 1 {
			continue
		}
		lv := []string{b.GPUs[0], b.Session, sim}
		ch <- prometheus.MustNewConstMetric(mem, prometheus.GaugeValue, float64(b.Share.MemoryMiB<<20), lv...)
		share := 1.0
		if b.Share.ComputePercent > 0 {
			share = float64(b.Share.ComputePercent) / 100
		}
		ch <- prometheus.MustNewConstMetric(compute, prometheus.GaugeValue, share, lv...)
	}
	c.a.mu.Unlock()
	n := 0
	if c.a.cfg.MPS != nil {
		n = len(c.a.cfg.MPS.Running())
	}
	ch <- prometheus.MustNewConstMetric(daemons, prometheus.GaugeValue, float64(n))
}
