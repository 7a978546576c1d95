package state

import (
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcd refuses a transaction that holds more operations than its
// --max-txn-ops (default 128) or a request larger than its
// --max-request-bytes (default 1.5 MiB). Every writer that packs many
// operations into one transaction (the placer's bind batches, node-loss
// handling, pending statuses) sizes it with TxnSize and checks it with one
// TxnBudget, so none of them learns the rules on its own.

// DefaultMaxTxnOps is etcd's default --max-txn-ops.
const DefaultMaxTxnOps = 128

// DefaultMaxTxnBytes is the request size a transaction of Voyager's may
// reach: two thirds of etcd's default --max-request-bytes (1.5 MiB), so that
// gRPC framing and estimates that run a little short never meet the limit.
const DefaultMaxTxnBytes = 1 << 20

// TxnSize is what one transaction holds, counted the way etcd counts it.
type TxnSize struct {
	// Compares, Then and Else count the transaction's own compares and
	// operations.
	Compares, Then, Else int
	// Nested is the largest Ops of a transaction nested in Then or Else.
	// etcd checks a nested transaction against --max-txn-ops less the
	// outer count: 127 nested one-op transactions pass the default of
	// 128, 128 fail.
	Nested int
	// Bytes is the size of the keys and values the transaction carries.
	Bytes int
}

// Ops is the number etcd compares with --max-txn-ops: the largest of the
// compares, the then-operations and the else-operations, plus what the
// largest nested transaction needs.
func (s TxnSize) Ops() int { return max(s.Compares, s.Then, s.Else) + s.Nested }

// Plus is s and o in one transaction.
func (s TxnSize) Plus(o TxnSize) TxnSize {
	return TxnSize{Compares: s.Compares + o.Compares, Then: s.Then + o.Then, Else: s.Else + o.Else,
		Nested: max(s.Nested, o.Nested), Bytes: s.Bytes + o.Bytes}
}

// String says what s holds, for error messages.
func (s TxnSize) String() string {
	return fmt.Sprintf("%d operations (%d compares, %d writes, nested %d), %d bytes", s.Ops(), s.Compares, s.Then, s.Nested, s.Bytes)
}

// TxnBudget is what one transaction may hold.
type TxnBudget struct {
	// MaxOps is etcd's --max-txn-ops (or less). Zero means
	// DefaultMaxTxnOps.
	MaxOps int
	// MaxBytes bounds the keys and values of one transaction. Zero means
	// DefaultMaxTxnBytes.
	MaxBytes int
}

func (b TxnBudget) limits() (int, int) {
	ops, bytes := b.MaxOps, b.MaxBytes
	if ops <= 0 {
		ops = DefaultMaxTxnOps
	}
	if bytes <= 0 {
		bytes = DefaultMaxTxnBytes
	}
	return ops, bytes
}

// Fits reports whether a transaction of size s passes.
func (b TxnBudget) Fits(s TxnSize) bool {
	ops, bytes := b.limits()
	return s.Ops() <= ops && s.Bytes <= bytes
}

// Check returns nil if s fits, else an error that names the limit.
func (b TxnBudget) Check(s TxnSize) error {
	if b.Fits(s) {
		return nil
	}
	ops, bytes := b.limits()
	return fmt.Errorf("transaction of %s exceeds the budget of %d operations and %d bytes", s, ops, bytes)
}

// SizeOf measures a built transaction.
func SizeOf(cmps []clientv3.Cmp, then, els []clientv3.Op) TxnSize {
	s := TxnSize{Compares: len(cmps), Then: len(then), Else: len(els)}
	for i := range cmps {
		s.Bytes += len(cmps[i].KeyBytes()) + len(cmps[i].ValueBytes())
	}
	for _, ops := range [][]clientv3.Op{then, els} {
		for _, op := range ops {
			if op.IsTxn() {
				n := SizeOf(op.Txn())
				s.Nested = max(s.Nested, n.Ops())
				s.Bytes += n.Bytes
				continue
			}
			s.Bytes += len(op.KeyBytes()) + len(op.ValueBytes())
		}
	}
	return s
}

// NestedSize is the size of one nested transaction of the given compares
// and operations, as one entry of an outer transaction's Then.
func NestedSize(compares, ops, bytes int) TxnSize {
	return TxnSize{Then: 1, Nested: max(compares, ops), Bytes: bytes}
}

// BindSize is the size BindOps gives a batch that writes nodes ledgers for
// placements sessions with bindings bindings in all, leaving out bytes
// (the caller adds its estimate) and quota guards (QuotaGuardSize).
func BindSize(nodes, placements, bindings int) TxnSize {
	return TxnSize{
		// Per node its ledger, its inventory key and its cordon key; per
		// session its queue entry.
		Compares: 3*nodes + placements,
		// Per node its ledger; per session delete pending, put status;
		// one put per binding.
		Then: nodes + 2*placements + bindings,
	}
}

// QuotaGuardSize is the size of the guards BindOps adds for scopes quota
// scopes (a user's or a group's quota): per scope the quota key's compare,
// two range compares over the other placers' usage marks, and a put of
// this placer's mark.
func QuotaGuardSize(scopes int) TxnSize {
	return TxnSize{Compares: 3 * scopes, Then: scopes}
}
