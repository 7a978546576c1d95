package fence

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// HeartbeatFile is the heartbeat's name in the fence directory.
const HeartbeatFile = "heartbeat.json"

// Heartbeat is what the agent tells its keeper, rewritten (atomically)
// after every successful lease renewal and whenever the node's containers
// change. Times are on the boot-time clock (Now): the same for every
// process of the machine, never stepped, and counting a suspend, as the
// lease in etcd does.
type Heartbeat struct {
	// Node names the node, for the keeper's logs and records.
	Node string `json:"node"`
	// PID is the agent's process.
	PID int `json:"pid"`
	// Renewed is when the last successful renewal of the node lease was
	// sent (boot-time nanoseconds); etcd's lease runs at least its TTL
	// from then.
	Renewed int64 `json:"renewed"`
	// Deadline is Renewed plus the agent's fence deadline (boot-time
	// nanoseconds): past it, the node's containers must not run.
	Deadline int64 `json:"deadline"`
	// Grace is the SIGTERM-to-SIGKILL grace of a fence.
	Grace time.Duration `json:"grace"`
	// Containers are the ids of every container of the node that runs or
	// may be started before the next heartbeat: what the node runs, and
	// the containers of its bindings.
	Containers []string `json:"containers"`
	// Parked says the agent shut down cleanly where its lease cannot
	// expire while it is down (voyager dev: its embedded etcd stops with
	// it): Deadline is then the end of time, and nothing is fenced until
	// an agent writes a heartbeat again.
	Parked bool `json:"parked,omitempty"`
}

// Now reads the boot-time clock (CLOCK_BOOTTIME) in nanoseconds.
func Now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		// Linux has had CLOCK_BOOTTIME since 2.6.39; never expected.
		panic(fmt.Sprintf("read CLOCK_BOOTTIME: %v", err))
	}
	return ts.Nano()
}

// At converts t, a time of this process's clock, to the boot-time clock.
func At(t time.Time) int64 {
	return Now() - int64(time.Since(t))
}

// WriteHeartbeat replaces dir's heartbeat with hb: written to a temporary
// file and renamed, so the keeper never reads half of one.
func WriteHeartbeat(dir string, hb Heartbeat) error {
	b, err := json.Marshal(hb)
	if err != nil {
		return fmt.Errorf("write heartbeat: %w", err)
	}
	return writeAtomic(dir, HeartbeatFile, b)
}

// ReadHeartbeat reads dir's heartbeat; an absent one is ErrNoHeartbeat.
func ReadHeartbeat(dir string) (Heartbeat, error) {
	b, err := os.ReadFile(filepath.Join(dir, HeartbeatFile))
	if errors.Is(err, os.ErrNotExist) {
		return Heartbeat{}, ErrNoHeartbeat
	}
	if err != nil {
		return Heartbeat{}, fmt.Errorf("read heartbeat: %w", err)
	}
	var hb Heartbeat
	if err := json.Unmarshal(b, &hb); err != nil {
		return Heartbeat{}, fmt.Errorf("read heartbeat %s: %w", filepath.Join(dir, HeartbeatFile), err)
	}
	return hb, nil
}

// ErrNoHeartbeat means no agent has written a heartbeat in the directory.
var ErrNoHeartbeat = errors.New("no heartbeat")

func writeAtomic(dir, name string, b []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create fence directory: %w", err)
	}
	f, err := os.CreateTemp(dir, "."+name+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	_, werr := f.Write(b)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := os.Rename(f.Name(), filepath.Join(dir, name)); err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}
