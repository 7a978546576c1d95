package etcdhealth

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Alarms are the alarm types etcd raises, as the gauges name them.
var Alarms = []pb.AlarmType{pb.AlarmType_NOSPACE, pb.AlarmType_CORRUPT}

// Ready returns a readiness check: nil when etcd answers a linearizable
// read of prefix (which needs a leader and a quorum) and no alarm is
// raised; otherwise an error that says which, and what to do.
func Ready(cli *clientv3.Client, prefix string) func(context.Context) error {
	return func(ctx context.Context) error {
		if _, err := cli.Get(ctx, prefix, clientv3.WithCountOnly()); err != nil {
			return fmt.Errorf("read etcd: %w", err)
		}
		resp, err := cli.AlarmList(ctx)
		if err != nil {
			return fmt.Errorf("list etcd alarms: %w", err)
		}
		if len(resp.Alarms) == 0 {
			return nil
		}
		var raised []string
		for _, a := range resp.Alarms {
			raised = append(raised, fmt.Sprintf("%s on member %x", a.Alarm, a.MemberID))
		}
		return fmt.Errorf("etcd alarm %s: %s", strings.Join(raised, ", "), advice(resp.Alarms))
	}
}

func advice(alarms []*pb.AlarmMember) string {
	for _, a := range alarms {
		if a.Alarm == pb.AlarmType_NOSPACE {
			return "etcd refuses writes until its database is below the quota: compact (etcdctl compact), defragment (etcdctl defrag), then etcdctl alarm disarm; see docs/architecture.md"
		}
	}
	return "a member's data is inconsistent: restore it from a healthy member's snapshot; see docs/architecture.md"
}

// Collector reports etcd's alarms and database size at each scrape:
// voyager_etcd_alarm{alarm} is 1 while an alarm of that type is raised
// (every type is reported, 0 included), voyager_etcd_db_size_bytes and
// voyager_etcd_db_size_in_use_bytes per endpoint. A scrape that cannot
// reach etcd reports voyager_etcd_up 0 and nothing else.
type Collector struct {
	cli     *clientv3.Client
	timeout time.Duration

	up, alarm, size, inUse *prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns a Collector over cli; each scrape's calls to etcd
// are bounded by two seconds.
func NewCollector(cli *clientv3.Client) *Collector {
	return &Collector{
		cli: cli, timeout: 2 * time.Second,
		up:    prometheus.NewDesc("voyager_etcd_up", "1 when etcd answered this scrape's alarm list.", nil, nil),
		alarm: prometheus.NewDesc("voyager_etcd_alarm", "1 while etcd has raised an alarm of this type (NOSPACE: writes refused until space is freed; CORRUPT: inconsistent member).", []string{"alarm"}, nil),
		size:  prometheus.NewDesc("voyager_etcd_db_size_bytes", "Size of the etcd member's database file, by endpoint.", []string{"endpoint"}, nil),
		inUse: prometheus.NewDesc("voyager_etcd_db_size_in_use_bytes", "Bytes of the etcd member's database in use (the rest is free after compaction until a defrag), by endpoint.", []string{"endpoint"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.up
	ch <- c.alarm
	ch <- c.size
	ch <- c.inUse
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	resp, err := c.cli.AlarmList(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	raised := map[pb.AlarmType]bool{}
	for _, a := range resp.Alarms {
		raised[a.Alarm] = true
	}
	for _, t := range Alarms {
		v := 0.0
		if raised[t] {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.alarm, prometheus.GaugeValue, v, t.String())
	}
	for _, ep := range c.cli.Endpoints() {
		st, err := c.cli.Status(ctx, ep)
		if err != nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.size, prometheus.GaugeValue, float64(st.DbSize), ep)
		ch <- prometheus.MustNewConstMetric(c.inUse, prometheus.GaugeValue, float64(st.DbSizeInUse), ep)
	}
}
