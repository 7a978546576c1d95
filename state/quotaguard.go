package state

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// dirUsage holds the placers' usage marks (see QuotaGuard).
const dirUsage = "usage"

// UsageDir is the prefix of every usage mark.
func (k Keys) UsageDir() string { return k.dir(dirUsage) }

// UsageMarks is the prefix of the usage marks of one quota: one key per
// placer that bound a session counted against it.
func (k Keys) UsageMarks(scope QuotaScope, name string) string {
	return k.key2(dirUsage, string(scope), name) + "/"
}

// UsageMark is the key of placer's usage mark for one quota.
func (k Keys) UsageMark(scope QuotaScope, name, placer string) string {
	return k.UsageMarks(scope, name) + placer
}

// QuotaOf is the key of the quota of scope and name; a team's maximum
// (QuotaTeams) is its team key.
func (k Keys) QuotaOf(scope QuotaScope, name string) string {
	if scope == QuotaTeams {
		return k.Team(name)
	}
	return k.key2(dirQuotas, string(scope), name)
}

// UsageMark records that a placer bound a session counted against a quota,
// stored at usage/<scope>/<name>/<placer>. Only its mod revision matters:
// a bind that checked the quota requires every other placer's mark to be
// older than the ledgers it summed the quota's use from.
type UsageMark struct {
	Placer  string    `json:"placer"`
	Session string    `json:"session"`
	At      time.Time `json:"at"`
}

// QuotaGuard makes a bind depend on one quota as the placer read it.
//
// A placer sums a quota's use over the ledgers of every node, but binds
// only on its own nodes: two placers that each see room under a quota
// could both bind and together exceed it, and comparing every ledger of
// the cluster would make every bind conflict with every other. Instead
// each bind that was checked against a quota writes the placer's usage
// mark for it, and requires that the quota key is at QuotaRevision (the
// limit it checked) and that no other placer's mark is newer than
// LedgersAt, the revision up to which its ledgers were read. A bind
// another placer committed after that read therefore refuses this one,
// which is planned again on ledgers that show it. The placer's own mark is
// not compared: its own binds of one pass were planned together, and a
// pass plans only once its caches show its earlier binds. The marks of
// placers that are gone are deleted by SweepUsageMarks, whose own mark
// (~swept) each bind compares as it does another placer's.
type QuotaGuard struct {
	Scope QuotaScope
	Name  string
	// QuotaRevision is the quota key's mod revision as read.
	QuotaRevision int64
	// LedgersAt is the revision the ledgers were read at.
	LedgersAt int64
	// Placer is the id of the binding placer, whose mark is written.
	Placer string
	// Session is recorded in the mark, for people reading it.
	Session string
}

// quotaGuardOps returns the compares and the mark write of g.
func quotaGuardOps(k Keys, g QuotaGuard, now time.Time) ([]clientv3.Cmp, clientv3.Op, error) {
	marks := k.UsageMarks(g.Scope, g.Name)
	mine := k.UsageMark(g.Scope, g.Name, g.Placer)
	end := clientv3.GetPrefixRangeEnd(marks)
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(k.QuotaOf(g.Scope, g.Name)), "=", g.QuotaRevision),
		// Every other placer's mark: the keys before ours and after it.
		clientv3.Compare(clientv3.ModRevision(marks), "<", g.LedgersAt+1).WithRange(mine),
		clientv3.Compare(clientv3.ModRevision(mine+"\x00"), "<", g.LedgersAt+1).WithRange(end),
	}
	v, err := Encode(UsageMark{Placer: g.Placer, Session: g.Session, At: now})
	if err != nil {
		return nil, clientv3.Op{}, fmt.Errorf("build quota guard: %w", err)
	}
	return cmps, clientv3.OpPut(mine, v), nil
}

// sweptMark is the name, among a quota's usage marks, of the mark
// SweepUsageMarks writes; placer ids begin "placer-", so none is named so.
const sweptMark = "~swept"

// usageSweepBatch is how many marks one SweepUsageMarks transaction
// deletes: two compares each, within etcd's default --max-txn-ops.
const usageSweepBatch = (DefaultMaxTxnOps - 2) / 2

// SweepUsageMarks deletes the usage marks of placers that are gone (their
// placers/<id> key absent) and returns how many it deleted. A placer's id
// is new at each start, so without it every placer that ever bound a
// session under a quota kept a mark there, and every quota-guarded bind
// compared them all.
//
// A mark matters to a bind whose ledgers were read before the mark was
// written; deleting it would let such a bind through. So the transaction
// that deletes a quota's marks also writes that quota's swept mark
// (usage/<scope>/<name>/~swept), which QuotaGuard compares as any other
// placer's: a bind whose ledgers were read before the sweep is refused
// and planned again, and one read after it saw every deleted mark's bind.
// Each transaction requires every mark it deletes unchanged and its placer
// still absent, so a placer that registers again keeps a mark it writes.
func SweepUsageMarks(ctx context.Context, kv clientv3.KV, k Keys, now time.Time) (int, error) {
	resp, err := kv.Txn(ctx).Then(
		clientv3.OpGet(k.UsageDir(), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(k.Placers(), clientv3.WithPrefix(), clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return 0, fmt.Errorf("read usage marks: %w", err)
	}
	live := map[string]bool{}
	for _, p := range resp.Responses[1].GetResponseRange().Kvs {
		live[string(p.Key)] = true
	}
	type mark struct {
		key, placer string
		rev         int64
	}
	dead := map[string][]mark{} // by the quota's marks prefix
	for _, m := range resp.Responses[0].GetResponseRange().Kvs {
		key := string(m.Key)
		i := strings.LastIndexByte(key, '/')
		dir, placer := key[:i+1], key[i+1:]
		if placer == sweptMark || live[k.Placer(placer)] {
			continue
		}
		dead[dir] = append(dead[dir], mark{key, placer, m.ModRevision})
	}
	v, err := Encode(UsageMark{Placer: sweptMark, At: now.UTC()})
	if err != nil {
		return 0, fmt.Errorf("sweep usage marks: %w", err)
	}
	deleted := 0
	for _, dir := range slices.Sorted(maps.Keys(dead)) {
		marks := dead[dir]
		for len(marks) > 0 {
			n := min(len(marks), usageSweepBatch)
			var cmps []clientv3.Cmp
			ops := []clientv3.Op{clientv3.OpPut(dir+sweptMark, v)}
			for _, m := range marks[:n] {
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(m.key), "=", m.rev),
					clientv3.Compare(clientv3.CreateRevision(k.Placer(m.placer)), "=", 0))
				ops = append(ops, clientv3.OpDelete(m.key))
			}
			r, err := kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
			if err != nil {
				return deleted, fmt.Errorf("sweep usage marks of %s: %w", dir, err)
			}
			if r.Succeeded {
				deleted += n
			}
			// Refused: a mark was written again, or its placer came back;
			// the next sweep reads them afresh.
			marks = marks[n:]
		}
	}
	return deleted, nil
}
