package runtime

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
)

// Tail returns up to n last lines of the log file at path (nil if it does
// not exist). It reads at most the last 64 KiB.
func Tail(path string, n int) ([]string, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read log: %w", err)
	}
	defer f.Close()
	const window = 64 << 10
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read log: %w", err)
	}
	off := max(fi.Size()-window, 0)
	b, err := io.ReadAll(io.NewSectionReader(f, off, fi.Size()-off))
	if err != nil {
		return nil, fmt.Errorf("read log: %w", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if off > 0 && len(lines) > 1 {
		lines = lines[1:] // the first line was cut by the window
	}
	if len(lines) == 1 && lines[0] == "" {
		return nil, nil
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines, nil
}

// trimMarker starts a log that TrimLog cut.
const trimMarker = "[voyager: earlier output trimmed]\n"

// TrimLog keeps the log file at path under maxBytes: when it is larger, it
// keeps about its last half (from a line start) behind a marker line. It
// trims in place because the container's shim holds the file open for
// appending; output written during the trim may be lost, never reordered.
// It reports whether it trimmed.
func TrimLog(path string, maxBytes int64) (bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("trim log: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false, fmt.Errorf("trim log: %w", err)
	}
	if maxBytes <= 0 || fi.Size() <= maxBytes {
		return false, nil
	}
	keep := maxBytes / 2
	tail := make([]byte, keep)
	if _, err := f.ReadAt(tail, fi.Size()-keep); err != nil && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("trim log: %w", err)
	}
	if i := bytes.IndexByte(tail, '\n'); i >= 0 && i < len(tail)-1 {
		tail = tail[i+1:]
	}
	if err := f.Truncate(0); err != nil {
		return false, fmt.Errorf("trim log: %w", err)
	}
	if _, err := f.WriteAt(append([]byte(trimMarker), tail...), 0); err != nil {
		return false, fmt.Errorf("trim log: %w", err)
	}
	return true, nil
}
