package placer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/voyager-gpu/voyager/internal/ctxwait"
	"github.com/voyager-gpu/voyager/state"
)

// Membership and ownership: a placer registers under placers/<id> with a
// lease; with Config.Sharded off the oldest live placer is active and the
// others stand by; sharded, each node belongs to one live placer by
// rendezvous hashing.

// membership keeps placers/<id> alive under a lease, re-registering after a
// lost lease, until ctx ends.
func (p *Placer) membership(ctx context.Context) {
	for ctx.Err() == nil {
		err := p.register(ctx)
		if ctx.Err() != nil {
			return
		}
		p.log.Warn("placer membership lost; registering again", "err", err)
		if !ctxwait.Sleep(ctx, time.Second) {
			return
		}
	}
}

func (p *Placer) register(ctx context.Context) error {
	// The session outlives ctx so that, on shutdown, its lease can still be
	// revoked: our key then goes at once and the other placers adopt our
	// nodes now rather than after the TTL.
	s, err := concurrency.NewSession(p.cli, concurrency.WithTTL(max(1, int(p.cfg.LeaseTTL/time.Second))), concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return fmt.Errorf("create placer lease: %w", err)
	}
	defer func() {
		s.Orphan()
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := p.cli.Revoke(rctx, s.Lease()); err != nil {
			p.log.Debug("revoke placer lease", "err", err)
		}
	}()
	host, _ := os.Hostname()
	v, err := state.Encode(state.Placer{ID: p.cfg.ID, Host: host, Started: p.cfg.Now().UTC()})
	if err != nil {
		return err
	}
	if _, err := p.cli.Put(ctx, p.cfg.Keys.Placer(p.cfg.ID), v, clientv3.WithLease(s.Lease())); err != nil {
		return fmt.Errorf("register placer: %w", err)
	}
	p.log.Debug("placer registered", "lease_ttl", p.cfg.LeaseTTL)
	select {
	case <-ctx.Done():
		return nil
	case <-s.Done():
		return errors.New("lease expired")
	}
}

// activeOf returns the id of the active placer among the live ones: the
// one whose key was created first (ties, which etcd never gives, by id).
// This placer, until its cache shows its own key, counts as the newest.
func (p *Placer) activeOf() string {
	best, bestRev := p.cfg.ID, int64(math.MaxInt64)
	for _, it := range p.placers.List() {
		if id := it.Value.ID; id != "" && (it.CreateRevision < bestRev || it.CreateRevision == bestRev && id < best) {
			best, bestRev = id, it.CreateRevision
		}
	}
	return best
}

// stands reports whether this placer stands by (Config.Sharded off and
// another placer active), logging when that changes.
func (p *Placer) stands() bool {
	if p.cfg.Sharded {
		return false
	}
	active := p.activeOf()
	role := int32(roleActive)
	if active != p.cfg.ID {
		role = roleStanding
	}
	if p.role.Swap(role) != role {
		if role == roleStanding {
			p.log.Info("placer standing by", "active", active)
		} else {
			p.log.Info("placer active")
		}
	}
	return role == roleStanding
}

// The roles of a placer when Config.Sharded is off (Placer.role).
const (
	roleActive = 1 + iota
	roleStanding
)

// owners returns the ids of the live placers (always including this one).
func (p *Placer) owners() []string {
	ids := []string{p.cfg.ID}
	for _, it := range p.placers.List() {
		if it.Value.ID != "" && it.Value.ID != p.cfg.ID {
			ids = append(ids, it.Value.ID)
		}
	}
	return ids
}
