package runtime

import (
	"context"
	"fmt"
)

// PullProgress is what a Runtime that can tell how far its image pulls
// have come implements: the agent reports it while a session waits for
// its image (its part's message), so a slow pull is seen progressing
// rather than stuck.
type PullProgress interface {
	// Pulled returns the bytes fetched so far and the bytes known to
	// fetch (0: not known yet), summed over the downloads under way in
	// the runtime's namespace; both 0 when none is under way.
	Pulled(ctx context.Context) (done, total int64, err error)
}

var _ PullProgress = (*Containerd)(nil)

// Pulled sums containerd's content ingests under way in the runtime's
// namespace: the layers and manifests a pull is downloading (what `ctr
// pull` shows as its progress).
func (c *Containerd) Pulled(ctx context.Context) (done, total int64, err error) {
	st, err := c.client.ContentStore().ListStatuses(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("list content ingests: %w", err)
	}
	for _, s := range st {
		done += s.Offset
		total += s.Total
	}
	return done, total, nil
}
