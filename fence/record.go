package fence

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// recordDir is where records live in the fence directory.
const recordDir = "fenced"

// Record says that a container was fenced: when, by whom and why. The
// fencer writes it before the first signal, so that whoever sees the
// container's process end (the agent's worker, now or after a restart)
// knows it was a fence and not an exit of the session's own.
type Record struct {
	Container string    `json:"container"`
	At        time.Time `json:"at"`
	// By is "agent" (the agent's own fence) or "keeper".
	By string `json:"by"`
	// Cause says why, with the outage: how long since the last renewal.
	Cause string `json:"cause"`
}

// WriteRecord writes r for its container in dir.
func WriteRecord(dir string, r Record) error {
	if !validID(r.Container) {
		return fmt.Errorf("write fence record: invalid container id %q", r.Container)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("write fence record: %w", err)
	}
	return writeAtomic(filepath.Join(dir, recordDir), r.Container+".json", b)
}

// ReadRecord returns the record of container id in dir, and whether there
// is one.
func ReadRecord(dir, id string) (Record, bool, error) {
	if dir == "" || !validID(id) {
		return Record{}, false, nil
	}
	b, err := os.ReadFile(filepath.Join(dir, recordDir, id+".json"))
	if errors.Is(err, os.ErrNotExist) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("read fence record: %w", err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return Record{}, false, fmt.Errorf("read fence record of %s: %w", id, err)
	}
	return r, true, nil
}

// RemoveRecord removes the record of container id in dir, if any: once
// the fenced attempt has been reported and its container removed.
func RemoveRecord(dir, id string) error {
	if dir == "" || !validID(id) {
		return nil
	}
	err := os.Remove(filepath.Join(dir, recordDir, id+".json"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove fence record: %w", err)
	}
	return nil
}

// validID keeps a container id a plain file name.
func validID(id string) bool {
	return id != "" && id != "." && id != ".." && !strings.ContainsAny(id, "/\x00")
}
