package nodeagent

import (
	"fmt"
	"strconv"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/voyager-gpu/voyager/internal/promfunc"
)

// GPUUsage is one GPU's load at one moment.
type GPUUsage struct {
	UUID string
	// Utilization is the fraction of the last sample period the GPU was busy.
	Utilization float64
	// MemoryUsedMiB is device memory in use.
	MemoryUsedMiB int64
}

// ReadNVMLUsage samples the utilisation and memory in use of every GPU. It
// returns ErrNoNVML without a driver.
func ReadNVMLUsage(lib nvml.Interface) ([]GPUUsage, error) {
	if err := initNVML(lib); err != nil {
		return nil, err
	}
	defer lib.Shutdown()
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("count GPUs: %s", lib.ErrorString(ret))
	}
	out := make([]GPUUsage, 0, n)
	for i := 0; i < n; i++ {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("open GPU %d: %s", i, lib.ErrorString(ret))
		}
		uuid, ret := d.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("read UUID of GPU %d: %s", i, lib.ErrorString(ret))
		}
		u := GPUUsage{UUID: uuid}
		if r, ret := d.GetUtilizationRates(); ret == nvml.SUCCESS {
			u.Utilization = float64(r.Gpu) / 100
		}
		if m, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			u.MemoryUsedMiB = int64(m.Used >> 20)
		}
		out = append(out, u)
	}
	return out, nil
}

// Collectors returns the agent's Prometheus collectors, labelled with the
// node. GPU utilisation and memory in use are sampled at each scrape
// (Config.Usage; none when it is nil). Register them once.
func (a *Agent) Collectors() []prometheus.Collector {
	labels := prometheus.Labels{"node": a.cfg.Node}
	m := promfunc.Set{Subsystem: "agent", Labels: labels}
	return []prometheus.Collector{
		m.Counter("registrations_total", "Leases the node was registered under; more than one means a lease was lost.",
			func() int64 { return int64(a.Registrations()) }),
		m.Gauge("registered", "1 while the node holds a live lease.", promfunc.Flag(a.Registered)),
		m.Gauge("sessions", "Bindings the agent is driving now.", func() float64 {
			a.mu.Lock()
			defer a.mu.Unlock()
			return float64(len(a.workers))
		}),
		m.Counter("container_starts_total", "Containers the agent created.", a.starts.Load),
		m.Counter("containers_adopted_total", "Running containers found and adopted after a restart or a lost lease.", a.adopted.Load),
		m.Counter("start_failures_total", "Sessions that failed to start.", a.startFailures.Load),
		m.Counter("fences_total", "Leases given up because they could not be renewed within the fence deadline (or expired), stopping the node's containers.",
			a.fences.Load),
		m.Counter("fenced_containers_total", "Containers stopped and removed by fences.", a.fenced.Load),
		m.Counter("fenced_attempts_total", "Attempts ended (reason Fenced) because their containers were fenced, by the agent or its fence keeper, or were gone after their launch: never started again in place.",
			a.fencedAttempts.Load),
		m.Gauge("lease_renewal_age_seconds", "Time since the send of the last successful renewal of the node lease; the agent fences at the fence deadline.",
			func() float64 {
				if r := a.renewed.Load(); r > 0 {
					return time.Since(time.Unix(0, r)).Seconds()
				}
				return 0
			}),
		m.Counter("activity_samples_total", "Samples of running sessions' activity (Jupyter, GPUs).", a.activitySamples.Load),
		m.Counter("activity_writes_total", "Samples that changed meaningfully and were written to a session's status.", a.activityWrites.Load),
		&usageCollector{a: a, labels: labels},
		newSessionGPUCollector(a, labels),
		newShareCollector(a, labels),
	}
}

// sessionGPULabels label a series of one GPU, or one fraction of a GPU,
// that a session holds here: the GPU's UUID, the session, and whether the
// GPU is simulated. The samples of allocated GPUs and the limits of
// fractions carry the same labels, so a dashboard joins them.
var sessionGPULabels = []string{"gpu", "session", "simulated"}

// sessionGPUDesc describes a per-session GPU series of the agent's node.
func sessionGPUDesc(name, help string, node prometheus.Labels) *prometheus.Desc {
	return prometheus.NewDesc(name, help, sessionGPULabels, node)
}

// describe sends ds: the Describe of a collector whose series are fixed.
func describe(ch chan<- *prometheus.Desc, ds ...*prometheus.Desc) {
	for _, d := range ds {
		ch <- d
	}
}

// sessionGPUCollector reports each allocated GPU's last sample: its
// utilisation, memory in use, and whether it is unused (no process and no
// utilisation for Config.GPUUnusedAfter).
type sessionGPUCollector struct {
	a                 *Agent
	util, mem, unused *prometheus.Desc
}

func newSessionGPUCollector(a *Agent, node prometheus.Labels) *sessionGPUCollector {
	return &sessionGPUCollector{a: a,
		util: sessionGPUDesc("voyager_agent_session_gpu_utilization_ratio",
			"Fraction of the last sample period each allocated GPU was busy (simulated=\"true\": made up from the container's CPU use).", node),
		mem: sessionGPUDesc("voyager_agent_session_gpu_memory_used_bytes",
			"Device memory in use on each allocated GPU at the last sample.", node),
		unused: sessionGPUDesc("voyager_agent_session_gpu_unused",
			"1 when an allocated GPU has had no process and no utilisation for the unused-after time.", node),
	}
}

func (c *sessionGPUCollector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch, c.util, c.mem, c.unused)
}

func (c *sessionGPUCollector) Collect(ch chan<- prometheus.Metric) {
	c.a.mu.Lock()
	defer c.a.mu.Unlock()
	for session, gpus := range c.a.gpuActivity {
		for _, g := range gpus {
			lv := []string{g.UUID, session, strconv.FormatBool(g.Simulated)}
			unused := 0.0
			if g.Unused {
				unused = 1
			}
			ch <- prometheus.MustNewConstMetric(c.util, prometheus.GaugeValue, float64(g.UtilizationPercent)/100, lv...)
			ch <- prometheus.MustNewConstMetric(c.mem, prometheus.GaugeValue, float64(g.MemoryUsedMiB<<20), lv...)
			ch <- prometheus.MustNewConstMetric(c.unused, prometheus.GaugeValue, unused, lv...)
		}
	}
}

var (
	gpuUtilDesc = prometheus.NewDesc("voyager_agent_gpu_utilization_ratio",
		"Fraction of the last sample period each GPU was busy (NVML).", []string{"uuid"}, nil)
	gpuMemDesc = prometheus.NewDesc("voyager_agent_gpu_memory_used_bytes",
		"Device memory in use on each GPU (NVML).", []string{"uuid"}, nil)
)

// usageCollector samples GPU usage at scrape time.
type usageCollector struct {
	a      *Agent
	labels prometheus.Labels
}

func (c *usageCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- gpuUtilDesc
	ch <- gpuMemDesc
}

func (c *usageCollector) Collect(ch chan<- prometheus.Metric) {
	if c.a.cfg.Usage == nil {
		return
	}
	us, err := c.a.cfg.Usage()
	if err != nil {
		c.a.log.Warn("sample GPU usage", "err", err)
		return
	}
	for _, u := range us {
		ch <- prometheus.MustNewConstMetric(gpuUtilDesc, prometheus.GaugeValue, u.Utilization, u.UUID)
		ch <- prometheus.MustNewConstMetric(gpuMemDesc, prometheus.GaugeValue, float64(u.MemoryUsedMiB<<20), u.UUID)
	}
}
