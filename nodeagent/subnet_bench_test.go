package nodeagent

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/benchsum"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// BenchmarkClaimSubnetColdStart: 200 agents that never claimed a subnet
// start at once (a new cluster, or one whose etcd was wiped) and claim
// theirs. Every claim compares the whole subnets/ prefix, so they take
// turns. Its ceiling is the same 200 claims written without a decision
// or a compare, as fast as 200 writers can. It reports the wall time of
// all claims against that, and the reads-and-transactions an agent made.
func BenchmarkClaimSubnetColdStart(b *testing.B) {
	const agents = 200
	cli := etcdtest.Start(b, etcdtest.Options{}).Client(b)
	ctx := context.Background()
	var tries atomic.Int64
	afterSubnetRead = func() { tries.Add(1) }
	b.Cleanup(func() { afterSubnetRead = nil })
	run := 0
	all := func(claim func(keys state.Keys, node string) error) time.Duration {
		run++
		keys := state.MustKeys(fmt.Sprintf("/bench%d", run))
		var wg sync.WaitGroup
		errs := make([]error, agents)
		start := time.Now()
		for i := range agents {
			wg.Go(func() { errs[i] = claim(keys, fmt.Sprintf("gpu-%04d", i)) })
		}
		wg.Wait()
		took := time.Since(start)
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		return took
	}
	var claims, ceiling time.Duration
	tries.Store(0)
	for range b.N {
		claims += all(func(keys state.Keys, node string) error {
			_, err := ClaimSubnet(ctx, cli, keys, SubnetRequest{Node: node, Seed: node}, time.Now())
			return err
		})
		ceiling += all(func(keys state.Keys, node string) error {
			v, err := state.Encode(state.SubnetClaim{Node: node, Subnet: "10.128.0.0/24", Claimed: time.Now()})
			if err == nil {
				_, err = cli.Txn(ctx).Then(clientv3.OpPut(keys.Subnet(node), v)).Commit()
			}
			return err
		})
	}
	perAgent := float64(tries.Load()) / float64(b.N*agents)
	b.ReportMetric(claims.Seconds()/float64(b.N), "claims-s")
	b.ReportMetric(ceiling.Seconds()/float64(b.N), "ceiling-s")
	b.ReportMetric(perAgent, "tries/agent")
	benchsum.Add(b, benchsum.Row{Figure: fmt.Sprintf("subnet claims of %d agents at once", agents), Value: claims.Seconds() / float64(b.N), Unit: "s",
		Ceiling: ceiling.Seconds() / float64(b.N), CeilingName: "the same puts without decision or compare"})
}
