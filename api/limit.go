package api

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// limiter keeps one token bucket per subject. Buckets idle long enough to
// be full again are dropped when the map grows, so it stays bounded by the
// number of recently active subjects.
type limiter struct {
	mu      sync.Mutex
	rate    rate.Limit
	burst   int
	now     func() time.Time
	buckets map[string]*bucket
}

type bucket struct {
	lim  *rate.Limiter
	last time.Time
}

// maxBuckets is when idle buckets are swept.
const maxBuckets = 10000

func newLimiter(r float64, burst int, now func() time.Time) *limiter {
	return &limiter{rate: rate.Limit(r), burst: burst, now: now, buckets: map[string]*bucket{}}
}

// allow takes one token of key's bucket; when none is left it says how
// long until one is.
func (l *limiter) allow(key string) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b, ok := l.buckets[key]
	if !ok {
		if len(l.buckets) >= maxBuckets {
			l.sweep(now)
		}
		b = &bucket{lim: rate.NewLimiter(l.rate, l.burst)}
		l.buckets[key] = b
	}
	b.last = now
	r := b.lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// sweep drops buckets idle for longer than it takes to refill.
func (l *limiter) sweep(now time.Time) {
	full := time.Duration(float64(l.burst) / float64(l.rate) * float64(time.Second))
	for k, b := range l.buckets {
		if now.Sub(b.last) > full {
			delete(l.buckets, k)
		}
	}
}
