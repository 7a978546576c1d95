package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/ctxwait"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// register grants a lease, writes the node record under it and keeps it
// alive. The returned context ends when the lease is lost.
func (a *Agent) register(ctx context.Context) (context.Context, context.CancelCauseFunc, error) {
	cli := a.cfg.Client
	ttl := int64(a.cfg.LeaseTTL / time.Second)
	gctx, gcancel := context.WithTimeout(ctx, a.cfg.LeaseTTL)
	defer gcancel()
	// etcd starts the lease's TTL when it grants it, after this.
	sent := time.Now()
	lease, err := cli.Grant(gctx, ttl)
	if err != nil {
		return nil, nil, fmt.Errorf("grant lease: %w", err)
	}
	a.mu.Lock()
	gpus := a.gpus
	a.mu.Unlock()
	gpus = a.offered(gctx, gpus, gpus, true)
	node := state.Node{
		Name: a.cfg.Node, Address: a.cfg.Address, Labels: a.cfg.Labels,
		CPUMilli: a.cfg.CPUMilli, MemoryMiB: a.cfg.MemoryMiB, GPUs: gpus, Ports: a.cfg.Ports,
		Simulated: a.cfg.Simulated, Agent: a.cfg.Version, Registered: time.Now().UTC(),
	}
	if sn, ok := a.cfg.Runtime.(subnetter); ok && a.cfg.JobRoutes != JobRoutesOff {
		node.Subnet = sn.Subnet() // its parts take part in job meshes
	}
	if node.GPUs == nil {
		node.GPUs = []state.GPU{}
	}
	v, err := state.Encode(node)
	if err != nil {
		return nil, nil, fmt.Errorf("register node: %w", err)
	}
	if _, err := cli.Put(gctx, a.cfg.Keys.Node(a.cfg.Node), v, clientv3.WithLease(lease.ID)); err != nil {
		return nil, nil, fmt.Errorf("register node: %w", err)
	}
	if time.Since(sent) >= a.cfg.FenceAfter {
		// Registering took so long that the lease is already due to be
		// fenced: give it up rather than run on borrowed time.
		a.revoke(ctx, lease.ID)
		return nil, nil, fmt.Errorf("register node: took %s, longer than the fence deadline %s", time.Since(sent).Round(time.Millisecond), a.cfg.FenceAfter)
	}
	leaseCtx, cancel := context.WithCancelCause(ctx)
	a.renewed.Store(sent.UnixNano())
	a.beat(sent)
	a.wg.Go(func() {
		cause := a.keepAlive(leaseCtx, lease.ID, sent)
		a.mu.Lock()
		a.leased = false
		a.mu.Unlock()
		cancel(cause)
		if errors.Is(cause, errFenced) {
			// When etcd answers again, end the lease now rather than at
			// its TTL: the placers then handle the node's sessions at once.
			a.revoke(ctx, lease.ID)
		}
	})
	if a.cfg.RecheckGPUs != nil {
		a.wg.Go(func() { a.recheckGPUs(leaseCtx, lease.ID, node) })
	}
	a.mu.Lock()
	a.epochs++
	a.leased = true
	a.registered = time.Now()
	a.mu.Unlock()
	a.log.Debug("node registered", "lease", fmt.Sprintf("%x", lease.ID), "ttl", a.cfg.LeaseTTL,
		"gpus", len(a.cfg.GPUs), "simulated", a.cfg.Simulated)
	return leaseCtx, cancel, nil
}

// recheckGPUs calls RecheckGPUs every GPURecheckEvery until ctx (the
// lease's) ends, and writes node again, under the same lease, whenever the
// inventory it returns differs from node's. The write compares the key's
// lease with this registration's: a key gone, or written since by a newer
// registration, is never taken back (that ends this loop). A write that
// fails otherwise is tried again at the next check.
func (a *Agent) recheckGPUs(ctx context.Context, lease clientv3.LeaseID, node state.Node) {
	for ctxwait.Sleep(ctx, a.cfg.GPURecheckEvery) {
		gpus := a.cfg.RecheckGPUs()
		if gpus == nil {
			gpus = []state.GPU{}
		}
		gpus = a.offered(ctx, gpus, node.GPUs, false)
		if reflect.DeepEqual(gpus, node.GPUs) {
			continue
		}
		next := node
		next.GPUs = gpus
		v, err := state.Encode(next)
		if err != nil {
			a.log.Error("publish GPU inventory", "err", err)
			continue
		}
		key := a.cfg.Keys.Node(a.cfg.Node)
		resp, err := a.cfg.Client.Txn(ctx).
			If(clientv3.Compare(clientv3.LeaseValue(key), "=", lease)).
			Then(clientv3.OpPut(key, v, clientv3.WithLease(lease))).Commit()
		if err != nil {
			a.log.Warn("publish GPU inventory; trying again at the next check", "err", err, "in", a.cfg.GPURecheckEvery)
			continue
		}
		if !resp.Succeeded {
			a.log.Warn("publish GPU inventory: the node key is no longer this registration's; leaving it", "lease", fmt.Sprintf("%x", lease))
			return
		}
		node = next
		a.mu.Lock()
		a.gpus = gpus
		a.mu.Unlock()
		healthy := 0
		var problems []string
		for _, g := range gpus {
			if g.Healthy {
				healthy++
			} else if g.Problem != "" {
				problems = append(problems, fmt.Sprintf("GPU %d %s: %s", g.Index, g.UUID, g.Problem))
			}
		}
		a.log.Info("GPU inventory changed; published", "gpus", len(gpus), "healthy", healthy, "problems", problems)
	}
}

// renewEvery is the renewal cadence: a third of the fence deadline.
func (a *Agent) renewEvery() time.Duration { return a.cfg.FenceAfter / 3 }

// keepAlive renews the lease every FenceAfter/3 (more often after a failed
// renewal) until ctx ends, and returns why it stopped: errLeaseLost when
// etcd says the lease is gone, errFenced when no renewal succeeded within
// FenceAfter of the send of the last one that did, nil when ctx ended.
//
// The cadence follows the fence deadline, not the TTL: an outage that
// begins just before a renewal is due must end within FenceAfter - every,
// or the agent fences. At every = FenceAfter/3 that is two thirds of
// FenceAfter (3.3 s at the defaults), more than an etcd leader election
// takes; at TTL/3 it was a third of FenceAfter.
//
// Each renewal is a KeepAliveOnce whose send time is known (renew hedges
// one that goes unanswered with another): etcd extends the lease to at
// least that time plus the TTL, so the agent's deadline, counted from it,
// always falls before the lease can expire.
// (clientv3's KeepAlive stream only says when an answer arrived, and gives
// up on a lease only once its TTL has passed: too late to fence.)
func (a *Agent) keepAlive(ctx context.Context, id clientv3.LeaseID, renewed time.Time) error {
	every := a.renewEvery()
	retry := min(every, 250*time.Millisecond)
	next := renewed.Add(every)
	for {
		deadline := renewed.Add(a.cfg.FenceAfter)
		if !ctxwait.Sleep(ctx, min(time.Until(next), time.Until(deadline))) {
			return nil
		}
		sent := time.Now()
		if !sent.Before(deadline) {
			return errFenced
		}
		sent, resp, err := a.renew(ctx, id, deadline, hedgeAfter(every))
		switch {
		case err == nil && resp.TTL > 0:
			renewed, next = sent, sent.Add(every)
			a.renewed.Store(sent.UnixNano())
			a.beat(sent)
		case err == nil, errors.Is(err, rpctypes.ErrLeaseNotFound):
			return errLeaseLost
		case ctx.Err() != nil:
			return nil
		default:
			a.log.Debug("renew node lease; retrying", "err", err, "fenceIn", time.Until(deadline).Round(time.Millisecond))
			next = time.Now().Add(retry)
		}
	}
}

// hedgeAfter is how long a renewal goes unanswered before the agent sends
// another beside it: half the renewal interval, at most a second (and at
// least a millisecond).
func hedgeAfter(every time.Duration) time.Duration {
	return max(min(every/2, time.Second), time.Millisecond)
}

// renewal is one KeepAliveOnce's outcome and when it was sent.
type renewal struct {
	sent time.Time
	resp *clientv3.LeaseKeepAliveResponse
	err  error
}

// renew sends a KeepAliveOnce for id, and another each time hedge passes
// with none answered, until one answers or deadline (an answer after it
// is no use: the fence must start). It returns the first answer that
// renewed the lease or said it is gone, with its own send time, or else
// the last failure.
//
// The client spreads calls over the etcd endpoints, and a connection to a
// member that went silent without a reset (its machine lost power, its
// link was cut) stays open until gRPC's keepalive finds it dead: a renewal
// sent on it hangs. The hedged ones go out on other connections, so one
// silent member of three never fences the node.
func (a *Agent) renew(ctx context.Context, id clientv3.LeaseID, deadline time.Time, hedge time.Duration) (time.Time, *clientv3.LeaseKeepAliveResponse, error) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel() // ends the attempts still out
	most := max(int(time.Until(deadline)/hedge)+1, 1)
	answers := make(chan renewal, most) // never blocks a sender
	send := func() {
		sent := time.Now()
		go func() {
			resp, err := a.cfg.Client.KeepAliveOnce(ctx, id)
			answers <- renewal{sent, resp, err}
		}()
	}
	send()
	out, tries := 1, 1
	timer := time.NewTimer(hedge)
	defer timer.Stop()
	var last renewal
	for out > 0 {
		select {
		case r := <-answers:
			out--
			if r.err == nil || errors.Is(r.err, rpctypes.ErrLeaseNotFound) {
				return r.sent, r.resp, r.err
			}
			last = r
		case <-timer.C:
			if tries < most && time.Now().Before(deadline) {
				send()
				out, tries = out+1, tries+1
				timer.Reset(hedge)
			}
		}
	}
	return last.sent, last.resp, last.err
}

// revoke ends a lease the agent gave up, in the background, trying until
// etcd answers, the lease has surely expired by itself, or ctx (the
// agent's run) ends.
func (a *Agent) revoke(ctx context.Context, id clientv3.LeaseID) {
	a.wg.Go(func() {
		ctx, cancel := context.WithTimeout(ctx, a.cfg.LeaseTTL)
		defer cancel()
		for {
			_, err := a.cfg.Client.Revoke(ctx, id)
			if err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound) || !ctxwait.Sleep(ctx, 250*time.Millisecond) {
				return
			}
		}
	})
}

// fence stops and removes every container of the node that runs (or was
// created and may yet run): the lease is about to expire, or has, and the
// placers will re-queue or end the sessions. Containers whose process has
// already exited stay, so that a later worker can still report how they
// ended. It returns the number of containers it stopped.
func (a *Agent) fence(cause string) int {
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.FenceGrace+a.cfg.LeaseTTL)
	defer cancel()
	infos, err := a.cfg.Runtime.List(ctx, map[string]string{LabelNode: a.cfg.Node})
	if err != nil {
		a.log.Error("fence: list containers; the node's containers may outlive its lease", "err", err)
		return 0
	}
	var wg sync.WaitGroup
	var n atomic.Int64
	for _, in := range infos {
		if in.State == runtime.StateStopped {
			continue
		}
		n.Add(1)
		a.noteFenced(in.ID, cause)
		wg.Go(func() {
			if err := a.cfg.Runtime.Stop(ctx, in.ID, a.cfg.FenceGrace); err != nil && !errors.Is(err, runtime.ErrNotFound) {
				a.log.Error("fence: stop container", "container", in.ID, "err", err)
			}
			if err := a.cfg.Runtime.Remove(ctx, in.ID); err != nil {
				a.log.Error("fence: remove container", "container", in.ID, "err", err)
			}
		})
	}
	wg.Wait()
	a.fenced.Add(n.Load())
	return int(n.Load())
}

// work reconciles until ctx (the lease) ends, then waits for every worker
// of this lease. A lease that ended unrenewed or expired fences the node
// first.
func (a *Agent) work(ctx context.Context) {
	bindings := watcher.New(a.cfg.Client, a.cfg.Keys.Bindings(a.cfg.Node), watcher.JSON[state.Binding],
		watcher.Options{Name: "bindings", Logger: a.log})
	bindings.AddHandler(func(watcher.Event[state.Binding]) { a.kick() })
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { _ = bindings.Run(ctx) })
	if err := bindings.WaitSynced(ctx); err != nil {
		a.endLease(ctx)
		return
	}
	tick := time.NewTicker(a.cfg.Resync)
	defer tick.Stop()
	for {
		a.reconcile(ctx, bindings.Snapshot())
		select {
		case <-ctx.Done():
			a.endLease(ctx)
			return
		case <-a.poke:
		case <-tick.C:
		}
	}
}

// endLease ends the work of a lease whose context ended: on a shutdown
// the workers stop and the containers stay for the next agent; a lease that
// went unrenewed or expired fences the node. Killing comes first, then
// waiting for the workers: a worker may be stuck in a slow call (an image
// pull, a stop's grace) well past the lease. A second sweep catches a
// container a worker started as the first one listed.
func (a *Agent) endLease(ctx context.Context) {
	cause := context.Cause(ctx)
	if !errors.Is(cause, errFenced) && !errors.Is(cause, errLeaseLost) {
		a.stopWorkers(cause)
		return
	}
	a.fences.Add(1)
	start := time.Now()
	ws := a.cancelWorkers(cause)
	renewed := time.Unix(0, a.renewed.Load())
	why := fmt.Sprintf("fenced by its agent: %v; the node lease was last renewed %s before (fence deadline %s)",
		cause, time.Since(renewed).Round(time.Millisecond), a.cfg.FenceAfter)
	a.mu.Lock()
	a.fencedRenewal = renewed
	a.mu.Unlock()
	n := a.fence(why)
	for _, w := range ws {
		<-w.done
	}
	n += a.fence(why)
	a.log.Warn("fenced: the node lease could not be renewed; stopped the node's containers",
		"cause", cause, "containers", n, "took", time.Since(start).Round(time.Millisecond),
		"sinceRenewal", time.Since(renewed).Round(time.Millisecond), "leaseTTL", a.cfg.LeaseTTL)
}
