package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"
)

func TestSupervise(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	boom := errors.New("boom")
	// waiter runs until ctx ends and records that it was stopped.
	waiter := func(stopped chan<- struct{}) func(context.Context) error {
		return func(ctx context.Context) error {
			<-ctx.Done()
			close(stopped)
			return nil
		}
	}

	t.Run("a failure stops the others and is returned", func(t *testing.T) {
		stopped := make(chan struct{})
		err := supervise(t.Context(), log, []component{
			{name: "waiter", run: waiter(stopped)},
			{name: "bad", run: func(context.Context) error { return boom }},
		})
		if !errors.Is(err, boom) || err.Error() != "bad: boom" {
			t.Errorf("supervise = %v, want bad: boom", err)
		}
		select {
		case <-stopped:
		default:
			t.Error("waiter was not stopped before supervise returned")
		}
	})

	t.Run("an early nil return is a failure", func(t *testing.T) {
		stopped := make(chan struct{})
		err := supervise(t.Context(), log, []component{
			{name: "waiter", run: waiter(stopped)},
			{name: "quitter", run: func(context.Context) error { return nil }},
		})
		if !errors.Is(err, errStoppedEarly) {
			t.Errorf("supervise = %v, want %v", err, errStoppedEarly)
		}
	})

	t.Run("cancel stops all cleanly", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		stopped := make(chan struct{})
		done := make(chan error, 1)
		go func() { done <- supervise(ctx, log, []component{{name: "waiter", run: waiter(stopped)}}) }()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("supervise = %v, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("supervise did not return after cancel")
		}
		<-stopped
	})

	t.Run("an error during shutdown is returned", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		err := supervise(ctx, log, []component{{name: "slow", run: func(ctx context.Context) error {
			<-ctx.Done()
			return boom
		}}})
		if !errors.Is(err, boom) {
			t.Errorf("supervise = %v, want %v", err, boom)
		}
	})
}
