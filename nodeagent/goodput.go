package nodeagent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// Goodput reports (issue 40). An elastic job's container gets a directory
// of its own at /run/voyager (the host side: <LogDir>/reports/<container>,
// made for the container's user, mode 0700) and VOYAGER_GOODPUT_FILE
// naming state.GoodputFile in it. The job may write its throughput at its
// size there; the head part's activity sampler reads it every
// ActivityEvery and publishes it in the part's activity, which the status
// merger folds into the status's elastic record (state.Elastic.Goodput),
// where the lifecycle controller's goodput-aware resizes read it.
//
// The file is the tenant's: it is read as hostile input. The agent opens
// only a regular file with one link (not a symbolic link, a FIFO, a
// device, a directory, or a hard link to a file elsewhere), never follows
// a link, reads at most goodputMaxBytes, and accepts one JSON object of
// the documented fields whose values pass state.GoodputReport.Validate
// (its size the GPUs the job holds). A refused file publishes no report
// but the activity's GoodputError, and is logged (a warning the first
// time, then at debug); reads happen once
// per sample, and a report alone moves the part's activity only when it
// changed meaningfully and goodputWriteSamples sampling intervals have
// passed since the last.

const (
	// ReportsPath is where an elastic job's container finds its report
	// directory.
	ReportsPath = "/run/voyager"
	// goodputMaxBytes bounds the report file.
	goodputMaxBytes = 4096
	// goodputWriteSamples is the least number of ActivityEvery between
	// two writes of the part's activity that a changed report alone
	// causes (2 minutes at the default 30 s).
	goodputWriteSamples = 4
	// Relative change of a report's throughput or efficiency that counts
	// as a change worth writing.
	goodputChange = 0.05
)

// errNoReport: the job wrote no report (yet).
var errNoReport = errors.New("no goodput report")

// reportsDir is the host directory mounted at ReportsPath in container
// id; "" when the agent keeps no log directory.
func (a *Agent) reportsDir(id string) string {
	if a.cfg.LogDir == "" {
		return ""
	}
	return filepath.Join(a.cfg.LogDir, "reports", id)
}

// reportsMount is the mount of an elastic job's report directory, and
// false for other sessions (and when the agent keeps no log directory).
func (a *Agent) reportsMount(s state.Session, id string) (runtime.Mount, bool) {
	dir := a.reportsDir(id)
	if s.Elastic == nil || s.Gang() || dir == "" {
		return runtime.Mount{}, false
	}
	// Private: a directory left by someone else is never handed over.
	return runtime.Mount{Source: dir, Target: ReportsPath, Create: true, Private: true}, true
}

// readGoodput reads and validates the report in dir (the host side of a
// container's report directory) of a job holding size GPUs. It returns
// errNoReport when there is no file.
func readGoodput(dir string, size int) (state.GoodputReport, error) {
	path := filepath.Join(dir, filepath.Base(state.GoodputFile))
	// Lstat first: a device or FIFO is refused without being opened.
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return state.GoodputReport{}, errNoReport
	}
	if err != nil {
		return state.GoodputReport{}, fmt.Errorf("read goodput report: %w", err)
	}
	if err := plainFile(fi); err != nil {
		return state.GoodputReport{}, err
	}
	// O_NOFOLLOW and O_NONBLOCK: a file swapped for a link or a FIFO
	// since the Lstat fails or does not block; fstat checks it is still
	// the file looked at.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return state.GoodputReport{}, errNoReport
	}
	if err != nil {
		return state.GoodputReport{}, fmt.Errorf("read goodput report: open: %w", err)
	}
	defer f.Close()
	fi2, err := f.Stat()
	if err != nil {
		return state.GoodputReport{}, fmt.Errorf("read goodput report: %w", err)
	}
	if err := plainFile(fi2); err != nil {
		return state.GoodputReport{}, err
	}
	if !os.SameFile(fi, fi2) {
		return state.GoodputReport{}, errors.New("read goodput report: the file changed while it was opened")
	}
	b, err := io.ReadAll(io.LimitReader(f, goodputMaxBytes+1))
	if err != nil {
		return state.GoodputReport{}, fmt.Errorf("read goodput report: %w", err)
	}
	if len(b) > goodputMaxBytes {
		return state.GoodputReport{}, fmt.Errorf("read goodput report: over %d bytes", goodputMaxBytes)
	}
	return parseGoodput(b, size)
}

// plainFile refuses anything but a regular file of one link, at most
// goodputMaxBytes long.
func plainFile(fi fs.FileInfo) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("read goodput report: not a regular file (%s); write the JSON report to %s itself", fi.Mode().Type(), state.GoodputFile)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink != 1 {
		return fmt.Errorf("read goodput report: the file has %d links; write a file of its own, not a hard link", st.Nlink)
	}
	if fi.Size() > goodputMaxBytes {
		return fmt.Errorf("read goodput report: %d bytes, over %d", fi.Size(), goodputMaxBytes)
	}
	return nil
}

// parseGoodput decodes one JSON object of GoodputReport's fields, nothing
// else, and validates it for a job of size GPUs.
func parseGoodput(b []byte, size int) (state.GoodputReport, error) {
	var r state.GoodputReport
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return state.GoodputReport{}, fmt.Errorf("read goodput report: want one JSON object {\"size\": N, \"samplesPerSecond\": X, \"efficiency\": E}: %s", clip(err.Error()))
	}
	if _, err := dec.Token(); err != io.EOF {
		return state.GoodputReport{}, errors.New("read goodput report: more than one JSON value")
	}
	if err := r.Validate(size); err != nil {
		return state.GoodputReport{}, fmt.Errorf("read goodput report: %w", err)
	}
	return r, nil
}

// clip bounds an error that may quote the tenant's bytes.
func clip(s string) string {
	const n = 200
	s = strings.ToValidUTF8(s, "?")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// goodputChanged reports whether report cur differs meaningfully from
// prev, the one last written: one of them absent, another size, or its
// throughput or efficiency moved by goodputChange of what was written.
func goodputChanged(prev, cur *state.GoodputSample) bool {
	if prev == nil || cur == nil {
		return (prev == nil) != (cur == nil)
	}
	moved := func(a, b float64) bool { return a != b && (a == 0 || abs64f(b-a) >= goodputChange*abs64f(a)) }
	return prev.Size != cur.Size || moved(prev.SamplesPerSecond, cur.SamplesPerSecond) || moved(prev.Efficiency, cur.Efficiency)
}

func abs64f(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// pruneReports removes the report directories of containers not in live.
func (a *Agent) pruneReports(live map[string]bool) (int, error) {
	root := filepath.Join(a.cfg.LogDir, "reports")
	entries, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) || a.cfg.LogDir == "" {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read report directory: %w", err)
	}
	n := 0
	var errs []error
	for _, e := range entries {
		if live[e.Name()] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
			errs = append(errs, fmt.Errorf("remove reports of %s: %w", e.Name(), err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
