package runtime_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/testlog"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
)

// TestLocalImagesAreNeverPulled: an absent voyager.local image is an
// error that says to import it, at once, without a pull (which would ask
// a DNS server about voyager.local); one that was imported is found.
func TestLocalImagesAreNeverPulled(t *testing.T) {
	var log testlog.Buffer
	c := runtimetest.New(t, runtime.ContainerdOptions{Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	fake := runtime.NewFake(func(string) bool { return true }) // even where everything could be pulled
	for _, rt := range []struct {
		name string
		rt   runtime.Runtime
	}{{"containerd", c}, {"fake", fake}} {
		t.Run(rt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := rt.rt.EnsureImage(ctx, "voyager.local/absent:v1")
			if !errors.Is(err, runtime.ErrImageNotImported) || !errors.Is(err, runtime.ErrImageNotFound) {
				t.Fatalf("EnsureImage(absent voyager.local image) = %v, want ErrImageNotImported (an ErrImageNotFound)", err)
			}
			if !strings.Contains(err.Error(), "never pulled") || !strings.Contains(err.Error(), "make image") {
				t.Errorf("error %q does not say the image is imported, never pulled, and how", err)
			}
		})
	}
	if strings.Contains(log.String(), "pulling image") {
		t.Errorf("the runtime tried to pull a voyager.local image:\n%s", log.String())
	}
	if err := c.EnsureImage(context.Background(), runtimetest.ImageRef); err != nil {
		t.Errorf("EnsureImage(imported %s) = %v", runtimetest.ImageRef, err)
	}
}
