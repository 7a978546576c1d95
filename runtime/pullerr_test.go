package runtime_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
)

// TestPullFromUnresolvableRegistry: an image whose registry's name does
// not resolve (.invalid never does) is reported as a registry that cannot
// be reached, naming it, not as an image that does not exist; an image
// under voyager.local in other letters is never pulled either.
func TestPullFromUnresolvableRegistry(t *testing.T) {
	c := runtimetest.New(t, runtime.ContainerdOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := c.EnsureImage(ctx, "registry.voyager-test.invalid/team/absent:1")
	if !errors.Is(err, runtime.ErrRegistryUnreachable) || !strings.Contains(err.Error(), "registry's name registry.voyager-test.invalid does not resolve") {
		t.Errorf("pull from an unresolvable registry: %v; want ErrRegistryUnreachable naming the registry", err)
	}
	if strings.Contains(err.Error(), "not found") && !strings.Contains(err.Error(), "no such host") {
		t.Errorf("pull from an unresolvable registry says not found: %v", err)
	}
	if !errors.Is(err, runtime.ErrImageNotFound) {
		t.Errorf("ErrRegistryUnreachable does not match ErrImageNotFound: %v", err)
	}
	err = c.EnsureImage(ctx, "VOYAGER.LOCAL/absent:1")
	if !errors.Is(err, runtime.ErrImageNotImported) {
		t.Errorf("VOYAGER.LOCAL/absent: %v; want ErrImageNotImported (never pulled)", err)
	}
}
