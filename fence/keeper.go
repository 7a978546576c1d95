package fence

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// LockFile is the keeper's lock in the fence directory: one keeper per
// directory holds it.
const LockFile = "keeper.lock"

// ErrAnotherKeeper means another keeper holds the directory's lock: it
// watches the node already.
var ErrAnotherKeeper = errors.New("another fence keeper watches this directory")

// Keeper kills the containers of a node whose agent's heartbeat went stale.
type Keeper struct {
	// Dir is the fence directory: the agent's heartbeat, the records, the
	// lock.
	Dir string
	// Poll is how often the heartbeat is read. Default 100ms.
	Poll time.Duration
	// AgentPID, with ExitWithAgent, is the agent that started the keeper,
	// for as long as it wrote no heartbeat.
	AgentPID int
	// ExitWithAgent makes Run return once the agent (the heartbeat's PID)
	// is gone and nothing it listed runs any more: a keeper that an agent
	// started for itself does not outlive its use. A keeper run as a
	// service of its own (systemd) stays for the next agent.
	ExitWithAgent bool
	// Proc is the proc file system. Default /proc.
	Proc   string
	Logger *slog.Logger
}

// Held reports whether a keeper holds dir's lock now.
func Held(dir string) bool {
	f, err := os.OpenFile(filepath.Join(dir, LockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return errors.Is(err, unix.EWOULDBLOCK)
	}
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}

// Run holds the directory's lock (ErrAnotherKeeper when another keeper
// does) and watches the heartbeat until ctx ends: whenever its deadline
// has passed, every container it lists that still has processes is
// recorded (WriteRecord) and its processes get SIGTERM, then SIGKILL once
// the heartbeat's grace has passed, until none is left or a fresh
// heartbeat (a new renewal) comes.
func (k *Keeper) Run(ctx context.Context) error {
	if k.Poll <= 0 {
		k.Poll = 100 * time.Millisecond
	}
	if k.Proc == "" {
		k.Proc = "/proc"
	}
	if k.Logger == nil {
		k.Logger = slog.Default()
	}
	if err := os.MkdirAll(k.Dir, 0o700); err != nil {
		return fmt.Errorf("run fence keeper: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(k.Dir, LockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("run fence keeper: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return ErrAnotherKeeper
		}
		return fmt.Errorf("run fence keeper: lock %s: %w", lock.Name(), err)
	}
	_ = lock.Truncate(0)
	_, _ = lock.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	k.Logger.Debug("fence keeper watching", "dir", k.Dir, "poll", k.Poll)

	w := watch{k: k, termed: map[string]int64{}, recorded: map[string]bool{}}
	tick := time.NewTicker(k.Poll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if done := w.once(); done {
			k.Logger.Info("fence keeper exits: its agent is gone and nothing it ran is left")
			return nil
		}
	}
}

// watch is the keeper's state across polls.
type watch struct {
	k        *Keeper
	deadline int64            // of the heartbeat being enforced
	termed   map[string]int64 // container → boot time of its SIGTERM
	recorded map[string]bool  // containers recorded this stale spell
	lastScan int64
	warned   bool
}

// once reads the heartbeat and acts; it reports whether the keeper may
// exit (ExitWithAgent).
func (w *watch) once() bool {
	k := w.k
	hb, err := ReadHeartbeat(k.Dir)
	if errors.Is(err, ErrNoHeartbeat) {
		return k.ExitWithAgent && k.AgentPID > 0 && !alive(k.AgentPID)
	}
	if err != nil {
		k.Logger.Warn("read heartbeat", "err", err)
		return false
	}
	now := Now()
	if hb.Deadline != w.deadline {
		// A new renewal (or a new agent): whatever was stale is no more.
		w.deadline, w.warned = hb.Deadline, false
		clear(w.termed)
		clear(w.recorded)
	}
	if now <= hb.Deadline {
		return hb.Parked && k.ExitWithAgent && !alive(hb.PID)
	}
	// Stale. Scan at every poll while something is being fenced, else
	// once a second, for a container a resumed agent may yet start.
	if len(w.termed) == 0 && w.warned && now-w.lastScan < int64(time.Second) {
		return k.ExitWithAgent && !alive(hb.PID)
	}
	w.lastScan = now
	ids := make(map[string]bool, len(hb.Containers))
	for _, id := range hb.Containers {
		ids[id] = true
	}
	procs, err := processes(k.Proc, ids)
	if err != nil {
		k.Logger.Error("fence: list processes", "err", err)
		return false
	}
	since := time.Duration(now - hb.Renewed)
	if !w.warned {
		w.warned = true
		k.Logger.Warn("the agent's heartbeat is stale: fencing the node's containers",
			"node", hb.Node, "agentPid", hb.PID, "sinceRenewal", since.Round(time.Millisecond),
			"pastDeadline", time.Duration(now-hb.Deadline).Round(time.Millisecond), "containers", len(procs))
	}
	for id, pids := range procs {
		if !w.recorded[id] {
			r := Record{Container: id, At: time.Now().UTC(), By: "keeper", Cause: fmt.Sprintf(
				"fenced by the node's fence keeper: its agent (pid %d) had not renewed the node lease for %s (fence deadline passed %s before)",
				hb.PID, since.Round(time.Millisecond), time.Duration(now-hb.Deadline).Round(time.Millisecond))}
			if err := WriteRecord(k.Dir, r); err != nil {
				k.Logger.Error("fence: write record; killing all the same", "container", id, "err", err)
			}
			w.recorded[id] = true
		}
		sig := syscall.SIGTERM
		if t, ok := w.termed[id]; ok {
			if now-t < int64(hb.Grace) {
				continue
			}
			sig = syscall.SIGKILL
		} else {
			w.termed[id] = now
		}
		for _, pid := range pids {
			if err := signal(k.Proc, pid, id, sig); err != nil {
				k.Logger.Warn("fence: signal", "container", id, "pid", pid, "signal", sig, "err", err)
			}
		}
		k.Logger.Info("fence: signalled container", "container", id, "signal", sig, "processes", len(pids))
	}
	for id := range w.termed {
		if _, left := procs[id]; !left {
			delete(w.termed, id)
			k.Logger.Info("fence: container stopped", "container", id)
		}
	}
	return k.ExitWithAgent && len(procs) == 0 && !alive(hb.PID)
}
