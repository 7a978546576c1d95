package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
)

// component is a long-running part of a process (the HTTP server, and later
// the placer, the agent, the API). run blocks until ctx ends, then cleans up
// and returns nil; an error, or a nil return before ctx ends, is a failure.
type component struct {
	name string
	run  func(ctx context.Context) error
}

// errStoppedEarly marks a component that returned nil while it should
// still have been running.
var errStoppedEarly = errors.New("stopped unexpectedly")

// supervise runs every component in its own goroutine until ctx ends or one
// fails. Either way it cancels the others, waits for all of them, and
// returns the first failure (nil after a clean stop on ctx). Failures are
// logged as they happen.
func supervise(ctx context.Context, log *slog.Logger, comps []component) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	for _, c := range comps {
		wg.Go(func() {
			err := c.run(ctx)
			if err == nil && ctx.Err() == nil {
				err = errStoppedEarly
			}
			if err == nil {
				return
			}
			err = fmt.Errorf("%s: %w", c.name, err)
			log.Error("component failed", "component", c.name, "err", err)
			mu.Lock()
			if first == nil {
				first = err
			}
			mu.Unlock()
			cancel(err)
		})
	}
	<-ctx.Done()
	log.Info("shutting down", "reason", context.Cause(ctx).Error())
	wg.Wait()
	return first
}
