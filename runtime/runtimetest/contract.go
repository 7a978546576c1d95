package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/runtime"
)

// Harness adapts one implementation to the contract suite.
type Harness struct {
	// New returns a fresh runtime with Image present and no containers.
	New func(t *testing.T) runtime.Runtime
	// Image is present in every runtime New returns.
	Image string
	// Serve is a command that runs until it is stopped.
	Serve []string
	// Exit returns a command that exits at once with code.
	Exit func(code int) []string
	// Busy is a command that keeps one CPU busy until it is stopped; nil
	// skips the check that CPUUsage grows (a fake runs no process).
	Busy []string
}

// Run checks the Runtime contract against the implementation h adapts.
func Run(t *testing.T, h Harness) {
	ctx := context.Background()
	spec := func(id string, args []string, labels map[string]string) runtime.Spec {
		return runtime.Spec{ID: id, Image: h.Image, Args: args, Labels: labels, MemoryBytes: 64 << 20, PidsLimit: 64}
	}
	t.Run("StartStatusList", func(t *testing.T) {
		rt := h.New(t)
		if err := rt.Start(ctx, spec("c1", h.Serve, map[string]string{"session": "a", "owner": "ada"})); err != nil {
			t.Fatal(err)
		}
		if err := rt.Start(ctx, spec("c2", h.Serve, map[string]string{"session": "b", "owner": "ada"})); err != nil {
			t.Fatal(err)
		}
		in, err := rt.Status(ctx, "c1")
		if err != nil {
			t.Fatal(err)
		}
		if in.State != runtime.StateRunning || in.Labels["session"] != "a" || in.Image != h.Image {
			t.Fatalf("Status(c1) = %+v; want running, session=a, image %s", in, h.Image)
		}
		for _, tc := range []struct {
			name   string
			labels map[string]string
			want   []string
		}{
			{"all", nil, []string{"c1", "c2"}},
			{"by owner", map[string]string{"owner": "ada"}, []string{"c1", "c2"}},
			{"by session", map[string]string{"session": "b"}, []string{"c2"}},
			{"both labels", map[string]string{"session": "a", "owner": "ada"}, []string{"c1"}},
			{"no match", map[string]string{"session": "zzz"}, nil},
			{"absent label", map[string]string{"role": "head"}, nil},
		} {
			infos, err := rt.List(ctx, tc.labels)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, in := range infos {
				got = append(got, in.ID)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("List(%s %v) = %v; want %v", tc.name, tc.labels, got, tc.want)
			}
		}
	})
	t.Run("DuplicateStartIsErrExists", func(t *testing.T) {
		rt := h.New(t)
		if err := rt.Start(ctx, spec("dup", h.Serve, nil)); err != nil {
			t.Fatal(err)
		}
		err := rt.Start(ctx, spec("dup", h.Serve, nil))
		if !errors.Is(err, runtime.ErrExists) {
			t.Fatalf("second Start = %v; want ErrExists", err)
		}
		if infos, _ := rt.List(ctx, nil); len(infos) != 1 {
			t.Fatalf("List after duplicate Start: %d containers; want 1", len(infos))
		}
	})
	t.Run("ConcurrentStartsOfOneIDMakeOne", func(t *testing.T) {
		rt := h.New(t)
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Go(func() { errs[i] = rt.Start(ctx, spec("race", h.Serve, nil)) })
		}
		wg.Wait()
		ok := 0
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case !errors.Is(err, runtime.ErrExists):
				t.Errorf("concurrent Start: %v; want nil or ErrExists", err)
			}
		}
		infos, _ := rt.List(ctx, nil)
		if ok != 1 || len(infos) != 1 {
			t.Fatalf("%d Starts succeeded, %d containers; want 1 and 1", ok, len(infos))
		}
	})
	t.Run("StopKeepsExitCodeUntilRemove", func(t *testing.T) {
		rt := h.New(t)
		if err := rt.Start(ctx, spec("s", h.Serve, nil)); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := rt.Stop(ctx, "s", 300*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("Stop took %v with a 300ms grace", d)
		}
		in, err := rt.Status(ctx, "s")
		if err != nil {
			t.Fatal(err)
		}
		if in.State != runtime.StateStopped || in.ExitCode <= 0 {
			t.Fatalf("after Stop: %+v; want stopped with a non-zero exit code", in)
		}
		if err := rt.Stop(ctx, "s", time.Second); err != nil {
			t.Fatalf("second Stop: %v; want nil", err)
		}
		if err := rt.Remove(ctx, "s"); err != nil {
			t.Fatal(err)
		}
		if _, err := rt.Status(ctx, "s"); !errors.Is(err, runtime.ErrNotFound) {
			t.Fatalf("Status after Remove: %v; want ErrNotFound", err)
		}
		if err := rt.Remove(ctx, "s"); err != nil {
			t.Fatalf("second Remove: %v; want nil", err)
		}
		if err := rt.Start(ctx, spec("s", h.Serve, nil)); err != nil {
			t.Fatalf("Start after Remove reuses the id: %v", err)
		}
	})
	t.Run("RemoveRunning", func(t *testing.T) {
		rt := h.New(t)
		if err := rt.Start(ctx, spec("r", h.Serve, nil)); err != nil {
			t.Fatal(err)
		}
		if err := rt.Remove(ctx, "r"); err != nil {
			t.Fatal(err)
		}
		if infos, _ := rt.List(ctx, nil); len(infos) != 0 {
			t.Fatalf("List after Remove: %v", infos)
		}
	})
	t.Run("WaitReturnsExitCode", func(t *testing.T) {
		rt := h.New(t)
		for _, code := range []int{0, 3} {
			id := fmt.Sprintf("exit%d", code)
			if err := rt.Start(ctx, spec(id, h.Exit(code), nil)); err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			got, err := rt.Wait(wctx, id)
			cancel()
			if err != nil || got != code {
				t.Fatalf("Wait(%s) = %d, %v; want %d", id, got, err, code)
			}
			in, err := rt.Status(ctx, id)
			if err != nil || in.State != runtime.StateStopped || in.ExitCode != code {
				t.Fatalf("Status(%s) = %+v, %v; want stopped with %d", id, in, err, code)
			}
			// Waiting again on an exited container answers at once.
			if got, err := rt.Wait(ctx, id); err != nil || got != code {
				t.Fatalf("second Wait(%s) = %d, %v", id, got, err)
			}
		}
	})
	t.Run("WaitEndsWithContext", func(t *testing.T) {
		rt := h.New(t)
		if err := rt.Start(ctx, spec("w", h.Serve, nil)); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		if _, err := rt.Wait(wctx, "w"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait on a running container with an ending ctx: %v; want DeadlineExceeded", err)
		}
	})
	t.Run("CPUUsage", func(t *testing.T) {
		rt := h.New(t)
		if err := rt.Start(ctx, spec("idle", h.Serve, nil)); err != nil {
			t.Fatal(err)
		}
		if d, err := rt.CPUUsage(ctx, "idle"); err != nil || d < 0 {
			t.Fatalf("CPUUsage of a running container = %v, %v; want a time ≥ 0", d, err)
		}
		if _, err := rt.CPUUsage(ctx, "nope"); !errors.Is(err, runtime.ErrNotFound) {
			t.Fatalf("CPUUsage of an unknown id: %v; want ErrNotFound", err)
		}
		if h.Busy == nil {
			return
		}
		if err := rt.Start(ctx, spec("busy", h.Busy, nil)); err != nil {
			t.Fatal(err)
		}
		first, err := rt.CPUUsage(ctx, "busy")
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			d, err := rt.CPUUsage(ctx, "busy")
			if err != nil {
				t.Fatal(err)
			}
			if d-first >= 200*time.Millisecond {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("a busy container used %v of CPU in 30s; want it to grow by 200ms", d-first)
			}
			time.Sleep(50 * time.Millisecond) // polling, bounded by deadline
		}
	})
	t.Run("Pids", func(t *testing.T) {
		rt := h.New(t)
		pl, ok := rt.(runtime.ProcessLister)
		if !ok {
			t.Fatalf("%T lists no processes (runtime.ProcessLister): both runtimes must", rt)
		}
		if err := rt.Start(ctx, spec("p", h.Serve, nil)); err != nil {
			t.Fatal(err)
		}
		in, err := rt.Status(ctx, "p")
		if err != nil {
			t.Fatal(err)
		}
		pids, err := pl.Pids(ctx, "p")
		if err != nil || !slices.Contains(pids, in.Pid) || !slices.IsSorted(pids) {
			t.Fatalf("Pids of a running container = %v, %v; want them sorted, with its process %d", pids, err, in.Pid)
		}
		if _, err := pl.Pids(ctx, "nope"); !errors.Is(err, runtime.ErrNotFound) {
			t.Fatalf("Pids of an unknown id: %v; want ErrNotFound", err)
		}
		if err := rt.Stop(ctx, "p", 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if pids, err := pl.Pids(ctx, "p"); err != nil || len(pids) != 0 {
			t.Fatalf("Pids of a stopped container = %v, %v; want none", pids, err)
		}
	})
	t.Run("UnknownID", func(t *testing.T) {
		rt := h.New(t)
		if _, err := rt.Status(ctx, "nope"); !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("Status: %v; want ErrNotFound", err)
		}
		if err := rt.Stop(ctx, "nope", time.Second); !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("Stop: %v; want ErrNotFound", err)
		}
		if _, err := rt.Wait(ctx, "nope"); !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("Wait: %v; want ErrNotFound", err)
		}
		if err := rt.Remove(ctx, "nope"); err != nil {
			t.Errorf("Remove: %v; want nil", err)
		}
	})
	t.Run("MissingImage", func(t *testing.T) {
		rt := h.New(t)
		s := spec("m", h.Serve, nil)
		s.Image = "voyager.invalid/absent:1"
		if err := rt.Start(ctx, s); !errors.Is(err, runtime.ErrImageNotFound) {
			t.Fatalf("Start with an absent image: %v; want ErrImageNotFound", err)
		}
		if err := rt.EnsureImage(ctx, h.Image); err != nil {
			t.Fatalf("EnsureImage(%s) of a present image: %v", h.Image, err)
		}
	})
	t.Run("InvalidSpec", func(t *testing.T) {
		rt := h.New(t)
		for name, s := range map[string]runtime.Spec{
			"bad id":         {ID: "a/b", Image: h.Image},
			"no image":       {ID: "x"},
			"negative limit": {ID: "x", Image: h.Image, MemoryBytes: -1},
			"relative mount": {ID: "x", Image: h.Image, Mounts: []runtime.Mount{{Source: "/tmp", Target: "rel"}}},
		} {
			if err := rt.Start(ctx, s); !errors.Is(err, runtime.ErrInvalidSpec) {
				t.Errorf("%s: Start = %v; want ErrInvalidSpec", name, err)
			}
		}
	})
}
