package state

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The range owners' user ids come from: above every system and
// conventional desktop range, below 2^31.
const (
	UIDFirst = 100000
	UIDCount = 1 << 20
)

// UIDRecord ties an owner to the user id their sessions run as. It is
// stored twice in one transaction, under the owner and under the number,
// so that a number is never handed to two owners.
type UIDRecord struct {
	Owner   string    `json:"owner"`
	UID     uint32    `json:"uid"`
	Created time.Time `json:"created"`
}

// UIDOwner is the key of owner's user id record.
func (k Keys) UIDOwner(owner string) string { return k.key2(dirUIDs, "owners", owner) }

// UIDNumber is the key of the record of user id uid.
func (k Keys) UIDNumber(uid uint32) string {
	return k.key2(dirUIDs, "numbers", strconv.FormatUint(uint64(uid), 10))
}

// uidProbes bounds the search past taken numbers.
const uidProbes = 128

// EnsureUID returns owner's user id, allocating one the first time: the
// number a hash of the owner picks, or the next free one after it. The
// allocation commits only if neither the owner nor the number has a
// record yet, so concurrent callers agree, and a number is never reused
// for another owner.
func EnsureUID(ctx context.Context, kv clientv3.KV, k Keys, owner string, now time.Time) (uint32, error) {
	if err := ValidateSubject("owner", owner); err != nil {
		return 0, fmt.Errorf("allocate user id: %w", err)
	}
	h := fnv.New32a()
	h.Write([]byte(owner))
	start := h.Sum32() % UIDCount
	for i := uint32(0); i < uidProbes; i++ {
		rec, _, err := Get[UIDRecord](ctx, kv, k.UIDOwner(owner))
		if err == nil {
			return rec.UID, nil
		}
		if !errors.Is(err, ErrNotFound) {
			return 0, fmt.Errorf("allocate user id of %s: %w", owner, err)
		}
		uid := UIDFirst + (start+i)%UIDCount
		v, err := Encode(UIDRecord{Owner: owner, UID: uid, Created: now.UTC()})
		if err != nil {
			return 0, fmt.Errorf("allocate user id of %s: %w", owner, err)
		}
		resp, err := kv.Txn(ctx).If(
			clientv3.Compare(clientv3.CreateRevision(k.UIDOwner(owner)), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(k.UIDNumber(uid)), "=", 0),
		).Then(clientv3.OpPut(k.UIDOwner(owner), v), clientv3.OpPut(k.UIDNumber(uid), v)).Commit()
		if err != nil {
			return 0, fmt.Errorf("allocate user id of %s: %w", owner, err)
		}
		if resp.Succeeded {
			return uid, nil
		}
		// The owner got one meanwhile (read again) or the number is
		// another's (try the next).
	}
	return 0, fmt.Errorf("allocate user id of %s: %d numbers after its own are taken", owner, uidProbes)
}
