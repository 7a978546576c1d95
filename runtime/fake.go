package runtime

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Fake is an in-memory Runtime for tests of its consumers. Its processes
// run until stopped unless Exit says otherwise; they honour SIGTERM at once
// (exit code 143). It keeps the same contract as Containerd
// (runtimetest.Run checks both).
type Fake struct {
	// Exit, when set before use, decides for each started spec whether its
	// process exits at once and with what code.
	Exit func(Spec) (code int, exits bool)

	mu         sync.Mutex
	images     map[string]bool
	pullable   func(ref string) bool
	containers map[string]*fakeContainer
	starts     int
}

type fakeContainer struct {
	spec    Spec
	state   State
	code    int
	done    chan struct{}
	started time.Time
	cpu     time.Duration
	pids    []uint32 // SetPids; nil: the one process, pid 1
}

var (
	_ Runtime       = (*Fake)(nil)
	_ ProcessLister = (*Fake)(nil)
)

// NewFake returns a Fake holding images. EnsureImage "pulls" any other
// image whose reference pullable accepts (nil: none).
func NewFake(pullable func(ref string) bool, images ...string) *Fake {
	f := &Fake{images: map[string]bool{}, pullable: pullable, containers: map[string]*fakeContainer{}}
	for _, i := range images {
		f.images[i] = true
	}
	return f
}

// EnsureImage succeeds for a held or pullable image.
func (f *Fake) EnsureImage(_ context.Context, ref string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.images[ref] {
		return nil
	}
	if IsLocalImage(ref) {
		return notImported(ref, "fake")
	}
	if f.pullable != nil && f.pullable(ref) {
		f.images[ref] = true
		return nil
	}
	return fmt.Errorf("pull image %s: %w", ref, ErrImageNotFound)
}

// Start records the container as running (or exited, per Exit) and
// creates its log file and the mount sources it asks for.
func (f *Fake) Start(_ context.Context, spec Spec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.images[spec.Image] {
		return fmt.Errorf("start container %s: %s: %w", spec.ID, spec.Image, ErrImageNotFound)
	}
	if _, ok := f.containers[spec.ID]; ok {
		return fmt.Errorf("start container %s: %w", spec.ID, ErrExists)
	}
	if spec.LogPath != "" {
		if err := os.MkdirAll(filepath.Dir(spec.LogPath), 0o750); err != nil {
			return fmt.Errorf("start container %s: create log directory: %w", spec.ID, err)
		}
		lf, err := os.OpenFile(spec.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o640)
		if err != nil {
			return fmt.Errorf("start container %s: %w", spec.ID, err)
		}
		_ = lf.Close()
	}
	for _, m := range spec.Mounts {
		if m.Create {
			if err := os.MkdirAll(m.Source, 0o750); err != nil {
				return fmt.Errorf("start container %s: create mount source: %w", spec.ID, err)
			}
		}
	}
	spec.Labels = cloneLabels(spec.Labels)
	c := &fakeContainer{spec: spec, state: StateRunning, done: make(chan struct{}), started: time.Now()}
	f.containers[spec.ID] = c
	f.starts++
	if f.Exit != nil {
		if code, exits := f.Exit(spec); exits {
			c.exit(code)
		}
	}
	return nil
}

func (c *fakeContainer) exit(code int) {
	if c.state == StateStopped {
		return
	}
	c.state, c.code = StateStopped, code
	close(c.done)
}

// Finish makes container id's process exit with code, after appending
// output to its log. It is how tests end a fake batch job.
func (f *Fake) Finish(id string, code int, output string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.containers[id]
	if !ok {
		return fmt.Errorf("finish container %s: %w", id, ErrNotFound)
	}
	if output != "" && c.spec.LogPath != "" {
		lf, err := os.OpenFile(c.spec.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o640)
		if err != nil {
			return fmt.Errorf("finish container %s: %w", id, err)
		}
		_, err = lf.WriteString(output)
		_ = lf.Close()
		if err != nil {
			return fmt.Errorf("finish container %s: %w", id, err)
		}
	}
	c.exit(code)
	return nil
}

// Starts counts successful Start calls since NewFake: a test's witness
// that nothing was started twice.
func (f *Fake) Starts() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.starts
}

// Spec returns the spec container id was started with.
func (f *Fake) Spec(id string) (Spec, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.containers[id]
	if !ok {
		return Spec{}, false
	}
	return c.spec, true
}

// Stop ends the process; a fake process exits on SIGTERM with code 143.
func (f *Fake) Stop(_ context.Context, id string, _ time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.containers[id]
	if !ok {
		return fmt.Errorf("stop container %s: %w", id, ErrNotFound)
	}
	c.exit(143)
	return nil
}

// Remove forgets the container.
func (f *Fake) Remove(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.containers[id]; ok {
		c.exit(137)
		delete(f.containers, id)
	}
	return nil
}

// Status reports one container.
func (f *Fake) Status(_ context.Context, id string) (Info, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.containers[id]
	if !ok {
		return Info{}, fmt.Errorf("status of container %s: %w", id, ErrNotFound)
	}
	return c.info(), nil
}

func (c *fakeContainer) info() Info {
	in := Info{ID: c.spec.ID, Image: c.spec.Image, Labels: cloneLabels(c.spec.Labels), State: c.state, ExitCode: -1, LogPath: c.spec.LogPath, Started: c.started}
	if c.state == StateStopped {
		in.ExitCode = c.code
	} else {
		in.Pid = 1
	}
	return in
}

// Wait blocks until the process exits.
func (f *Fake) Wait(ctx context.Context, id string) (int, error) {
	f.mu.Lock()
	c, ok := f.containers[id]
	f.mu.Unlock()
	if !ok {
		return -1, fmt.Errorf("wait for container %s: %w", id, ErrNotFound)
	}
	select {
	case <-c.done:
		f.mu.Lock()
		defer f.mu.Unlock()
		return c.code, nil
	case <-ctx.Done():
		return -1, fmt.Errorf("wait for container %s: %w", id, ctx.Err())
	}
}

// List returns the containers whose labels include labels.
func (f *Fake) List(_ context.Context, labels map[string]string) ([]Info, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Info
	for _, c := range f.containers {
		if matches(c.spec.Labels, labels) {
			out = append(out, c.info())
		}
	}
	slices.SortFunc(out, func(a, b Info) int { return cmpString(a.ID, b.ID) })
	return out, nil
}

// SetCPUUsage sets the CPU time container id reports from CPUUsage: how
// tests make a fake process busy (raise it between samples) or idle.
func (f *Fake) SetCPUUsage(id string, d time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.containers[id]
	if !ok {
		return fmt.Errorf("set CPU usage of container %s: %w", id, ErrNotFound)
	}
	c.cpu = d
	return nil
}

// SetPids sets what Pids reports for container id while it runs (as if
// its process had started those): a test's stand-in for the processes
// that use a GPU.
func (f *Fake) SetPids(id string, pids ...uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.containers[id]
	if !ok {
		return fmt.Errorf("set pids of container %s: %w", id, ErrNotFound)
	}
	c.pids = slices.Clone(pids)
	slices.Sort(c.pids)
	return nil
}

// Pids reports what SetPids set, or the process's pid 1, while the
// container runs; none once it stopped.
func (f *Fake) Pids(_ context.Context, id string) ([]uint32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.containers[id]
	if !ok {
		return nil, fmt.Errorf("list processes of container %s: %w", id, ErrNotFound)
	}
	switch {
	case c.state != StateRunning:
		return nil, nil
	case c.pids != nil:
		return slices.Clone(c.pids), nil
	}
	return []uint32{1}, nil
}

// CPUUsage reports what SetCPUUsage set (0 until then).
func (f *Fake) CPUUsage(_ context.Context, id string) (time.Duration, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.containers[id]
	if !ok {
		return 0, fmt.Errorf("CPU usage of container %s: %w", id, ErrNotFound)
	}
	return c.cpu, nil
}
