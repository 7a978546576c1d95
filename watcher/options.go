package watcher

import (
	"log/slog"
	"math/rand/v2"
	"time"
)

// Options tune a Cache. The zero value is usable: every field has a default.
type Options struct {
	// Name identifies the cache in logs. Default: the prefix.
	Name string
	// PageSize is how many keys one list request reads. Default 1000.
	PageSize int64
	// Logger receives the cache's logs. Default slog.Default().
	Logger *slog.Logger
	// BackoffMin and BackoffMax bound the wait between attempts after a
	// failed list or a broken watch stream. The wait doubles per failure,
	// with jitter, up to BackoffMax, and returns to BackoffMin once the
	// cache makes progress. Defaults 100ms and 10s.
	BackoffMin, BackoffMax time.Duration
}

func (o Options) withDefaults(prefix string) Options {
	if o.Name == "" {
		o.Name = prefix
	}
	if o.PageSize <= 0 {
		o.PageSize = 1000
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.BackoffMin <= 0 {
		o.BackoffMin = 100 * time.Millisecond
	}
	if o.BackoffMax <= 0 {
		o.BackoffMax = 10 * time.Second
	}
	if o.BackoffMax < o.BackoffMin {
		o.BackoffMax = o.BackoffMin
	}
	return o
}

// backoff is a bounded exponential backoff with "equal jitter": each wait is
// half the current step plus a random part of the other half, so retries of
// many caches spread out but never drop to zero.
type backoff struct {
	min, max time.Duration
	step     time.Duration
}

func (b *backoff) next() time.Duration {
	if b.step == 0 {
		b.step = b.min
	}
	d := b.step
	if b.step < b.max {
		b.step = min(2*b.step, b.max)
	}
	return d/2 + rand.N(d/2+1)
}

func (b *backoff) reset() { b.step = 0 }
