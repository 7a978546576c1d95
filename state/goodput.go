package state

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// GoodputFile is where a job's container may write its goodput report
// (GoodputReport as JSON): the agent reads it every activity sample and
// publishes it in the session's status (Status.Goodput).
const GoodputFile = "/run/voyager/goodput.json"

// GoodputReport is what a job says of its throughput at its current
// size, in the file it writes (GoodputFile). Efficiency is its statistical
// efficiency (Pollux's: the progress one sample makes at this size's
// batch, relative to a small batch's), in (0, 1]; zero means 1.
type GoodputReport struct {
	Size             int     `json:"size"`
	SamplesPerSecond float64 `json:"samplesPerSecond"`
	Efficiency       float64 `json:"efficiency,omitempty"`
}

// Goodput limits: a report of more GPUs or samples than these is refused.
const (
	MaxGoodputSize    = 4096
	MaxGoodputSamples = 1e12
	// MaxGoodputSizes is how many sizes a status keeps (the newest).
	MaxGoodputSizes = 16
)

// Validate checks a report a job wrote at size GPUs: its size is that,
// its throughput a finite number from 0 to MaxGoodputSamples, its
// efficiency from 0 to 1.
func (r GoodputReport) Validate(size int) error {
	switch {
	case r.Size < 1 || r.Size > MaxGoodputSize:
		return fmt.Errorf("size %d: want the job's GPUs, 1 to %d", r.Size, MaxGoodputSize)
	case size > 0 && r.Size != size:
		return fmt.Errorf("size %d: the job runs at %d GPUs now; report the size it runs at", r.Size, size)
	case math.IsNaN(r.SamplesPerSecond) || r.SamplesPerSecond < 0 || r.SamplesPerSecond > MaxGoodputSamples:
		return fmt.Errorf("samplesPerSecond %v: want a number from 0 to %g", r.SamplesPerSecond, float64(MaxGoodputSamples))
	case math.IsNaN(r.Efficiency) || r.Efficiency < 0 || r.Efficiency > 1:
		return fmt.Errorf("efficiency %v: want a number from 0 to 1 (0 or absent: 1)", r.Efficiency)
	}
	return nil
}

// GoodputSample is one size's latest report, as a status keeps it: the
// report and when the agent read it.
type GoodputSample struct {
	GoodputReport
	At time.Time `json:"at"`
}

// Goodput is the sample's throughput times its efficiency (1 if unset).
func (g GoodputSample) Goodput() float64 {
	if g.Efficiency <= 0 {
		return g.SamplesPerSecond
	}
	return g.SamplesPerSecond * g.Efficiency
}

// FoldGoodput is samples with s in place of the sample of its size,
// ordered by size, the newest MaxGoodputSizes kept. samples is not
// changed.
func FoldGoodput(samples []GoodputSample, s GoodputSample) []GoodputSample {
	out := make([]GoodputSample, 0, len(samples)+1)
	for _, x := range samples {
		if x.Size != s.Size {
			out = append(out, x)
		}
	}
	out = append(out, s)
	if len(out) > MaxGoodputSizes {
		slices.SortFunc(out, func(a, b GoodputSample) int { return b.At.Compare(a.At) })
		out = out[:MaxGoodputSizes]
	}
	slices.SortFunc(out, func(a, b GoodputSample) int { return a.Size - b.Size })
	return out
}

// foldActivityGoodput is el with the goodput report of activity a folded
// into its Goodput (a copy; el is not changed), or el itself when either
// is nil or a carries no report.
func foldActivityGoodput(el *Elastic, a *Activity) *Elastic {
	if el == nil || a == nil || a.Goodput == nil {
		return el
	}
	next := *el
	next.Goodput = FoldGoodput(el.Goodput, *a.Goodput)
	return &next
}
