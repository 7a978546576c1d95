package nodeagent

import (
	"context"
	"fmt"
	"math/rand"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/benchsum"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
)

// renewBench is the load BenchmarkLeaseRenewals offers: the node leases of
// a site of renewNodes agents at the default timings, renewed from
// renewClients connections (agents' connections, many to one here).
const (
	renewNodes   = 10000
	renewClients = 100
	renewWarm    = 4 * time.Second  // every lease renewed twice before the window
	renewWindow  = 10 * time.Second // 60,000 renewals at the agents' cadence
)

// BenchmarkLeaseRenewals measures what the node leases of 10,000 agents
// cost etcd (Debian's, on a core of its own, fsync on): etcd's CPU per
// renewal and how busy its core is, for
//
//   - agent: the agents' renewals at the default timings (a 10 s lease
//     renewed every third of the 5 s fence deadline: 6,000 renewals a
//     second), as Agent.renew sends them (a KeepAliveOnce each, hedged when
//     unanswered), with the round trip of each (p50, p99 over the window's
//     60,000);
//   - agent-tls: the same over TLS with client certificates, as deployed
//     (docs/deployment.md; etcd's authentication off: it would only name
//     the user by the certificate's CN);
//   - agent-ttl30, agent-ttl30-tls: the same at the timings
//     docs/deployment.md gives a large site (a 30 s lease, fenced after
//     15 s: 2,000 a second);
//   - client-keepalive: the floor, the default timings' renewals sent by
//     clientv3's own KeepAlive, which puts all a client's leases on one
//     stream (its cadence is the TTL's third: leases of 5 s to renew as
//     often). Agents cannot renew that way: each has a lease and a
//     connection of its own, and the fence needs each renewal's send time.
//
// A case that overloads etcd says so rather than failing: failed-renewals
// counts the renewals that went unanswered within the fence deadline, and
// of-offered is the rate answered over the rate offered.
func BenchmarkLeaseRenewals(b *testing.B) {
	var deflt, large Config
	deflt.defaults()
	large.LeaseTTL, large.FenceAfter = 30*time.Second, 15*time.Second
	large.defaults()
	// With -count N each case runs N times in a row (the function
	// itself runs once): the summary gets one row per run, the floor's
	// i-th run beside the agent's i-th, so it shows their median.
	perRenewal := map[string][]float64{}
	for _, tc := range []struct {
		name string
		cfg  Config
		tls  bool
	}{{"client-keepalive", deflt, false}, {"agent", deflt, false}, {"agent-tls", deflt, true},
		{"agent-ttl30", large, false}, {"agent-ttl30-tls", large, true}} {
		b.Run(tc.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				perRenewal[tc.name] = append(perRenewal[tc.name], benchRenewals(b, tc.name == "client-keepalive", tc.tls, tc.cfg))
			}
		})
	}
	floors, agents := perRenewal["client-keepalive"], perRenewal["agent"]
	for i := range min(len(floors), len(agents)) {
		if floors[i] > 0 && agents[i] > 0 {
			benchsum.Add(b, benchsum.Row{Figure: fmt.Sprintf("node lease renewals, %d nodes every %s, etcd on a core of its own", renewNodes, (&Agent{cfg: deflt}).renewEvery().Round(time.Millisecond)),
				Value: agents[i], Unit: "etcd µs/renewal", Ceiling: floors[i], CeilingName: "clientv3's KeepAlive, 100 leases a stream"})
		}
	}
}

// benchRenewals renews renewNodes leases at cfg's timings through the
// window, as agents do or (library) with clientv3's KeepAlive, over TLS or
// not, and reports its figures; it returns etcd's CPU per renewal in µs.
func benchRenewals(b *testing.B, library, tls bool, cfg Config) float64 {
	every := (&Agent{cfg: cfg}).renewEvery()
	var e interface{ CPU() (time.Duration, error) }
	clis := make([]*clientv3.Client, renewClients)
	if tls {
		s := etcdtest.StartSecureOwnCore(b)
		for i := range clis {
			clis[i] = s.Client(b, fmt.Sprintf("agent-%d", i))
		}
		e = s
	} else {
		x := etcdtest.StartOwnCore(b)
		for i := range clis {
			clis[i] = x.Client(b)
		}
		e = x
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ttl := int64(cfg.LeaseTTL / time.Second)
	if library {
		ttl = int64(3 * every / time.Second)
	}
	ids := make([]clientv3.LeaseID, renewNodes)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i := range ids {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			l, err := clis[i%renewClients].Grant(ctx, ttl)
			if err != nil {
				b.Errorf("grant node lease: %v", err)
				return
			}
			ids[i] = l.ID
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}

	var mu sync.Mutex
	var window bool
	var failed int
	var trips []time.Duration // one per renewal answered in the window
	done := func(trip time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		if !window {
			return
		}
		if err != nil {
			failed++
			return
		}
		trips = append(trips, trip)
	}
	var running sync.WaitGroup
	for i, id := range ids {
		cli := clis[i%renewClients]
		if library {
			ch, err := cli.KeepAlive(ctx, id)
			if err != nil {
				b.Fatalf("keep lease alive: %v", err)
			}
			running.Go(func() {
				for range ch {
					done(0, nil)
				}
			})
			continue
		}
		running.Go(func() {
			a := &Agent{cfg: cfg}
			a.cfg.Client = cli
			// The agents' renewals spread over the interval, as agents
			// started at different moments do.
			t := time.NewTimer(time.Duration(rand.Int63n(int64(every))))
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				t.Reset(every)
				sent := time.Now()
				_, _, err := a.renew(ctx, id, sent.Add(cfg.FenceAfter), hedgeAfter(every))
				if ctx.Err() == nil {
					done(time.Since(sent), err)
				}
			}
		})
	}
	time.Sleep(renewWarm)
	mu.Lock()
	window = true
	mu.Unlock()
	c0, err := e.CPU()
	if err != nil {
		b.Fatal(err)
	}
	s0, t0 := benchsum.ProcessCPU(b), time.Now()
	time.Sleep(renewWindow)
	c1, err := e.CPU()
	if err != nil {
		b.Fatal(err)
	}
	s1, t1 := benchsum.ProcessCPU(b), time.Now()
	mu.Lock()
	window = false
	n, fails, lat := len(trips), failed, slices.Clone(trips)
	mu.Unlock()
	cancel()
	running.Wait()

	// clientv3's KeepAlive renews a lease of 3 × every every third of its
	// TTL, counted from each answer and checked every 500 ms: about as
	// often (0.97–1.1 of it measured).
	offered := float64(renewNodes) / every.Seconds()
	b.ReportMetric(float64(fails), "failed-renewals")
	b.ReportMetric(float64(n)/t1.Sub(t0).Seconds()/offered, "of-offered")
	if n == 0 {
		b.Fatalf("no renewal answered in the window (%d failed)", fails)
	}
	cpu := float64((c1 - c0).Microseconds()) / float64(n)
	b.ReportMetric(float64(n)/t1.Sub(t0).Seconds(), "renewals/s")
	b.ReportMetric(cpu, "etcd-cpu-us/renewal")
	b.ReportMetric(float64(c1-c0)/float64(t1.Sub(t0)), "etcd-core-busy")
	// What sending them cost the renewing side, all of it in this process
	// (in a site, spread over the agents).
	b.ReportMetric(float64((s1-s0).Microseconds())/float64(n), "client-cpu-us/renewal")
	if !library {
		b.ReportMetric(benchsum.QuantileMS(lat, 0.5), "renewal-ms-p50")
		b.ReportMetric(benchsum.QuantileMS(lat, 0.99), "renewal-ms-p99")
	}
	return cpu
}
