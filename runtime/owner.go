package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// OwnersDir is where a machine's Voyager processes record what they create
// on the host outside containerd (isolated networks, and the network
// namespaces and bridges of tests), one JSON file each, so that a sweep can
// find what a killed process left behind and prove whose it was.
const OwnersDir = "/run/voyager/owners"

// EnvHostOwner names a label a process records with what it creates on the
// host (Owner.Label). A test binary sets it to TestLabel of itself, and the
// processes it starts (agents, voyager dev) inherit it: a sweep at the
// start of a test run removes only what was made under a test binary that
// has ended.
const EnvHostOwner = "VOYAGER_HOST_OWNER"

// TestLabel is the EnvHostOwner value of the test binary pid whose start
// time is start.
func TestLabel(pid int, start uint64) string {
	return "test:" + strconv.Itoa(pid) + ":" + strconv.FormatUint(start, 10)
}

// EndedTest reports whether o was made under a test binary (its Label a
// TestLabel) that has ended.
func (o Owner) EndedTest() bool {
	f := strings.Split(o.Label, ":")
	if len(f) != 3 || f[0] != "test" {
		return false
	}
	pid, err1 := strconv.Atoi(f[1])
	start, err2 := strconv.ParseUint(f[2], 10, 64)
	if err1 != nil || err2 != nil {
		return false
	}
	st, err := ProcessStart(pid)
	return err != nil || st != start
}

// Owner records one thing created on the host and the process that made
// it. Pid and Start (the process's start time in clock ticks since boot,
// from /proc/<pid>/stat) tell a live creator from a dead one whose pid was
// reused.
type Owner struct {
	// Kind is "network" (an isolated network: NetworkOptions), "netns" (a
	// named network namespace, ip netns), "link" (a bridge or veth),
	// "namespace" (a containerd namespace an agent runs sessions in), "cdi"
	// (a directory of simulated CDI specs) or "dir" (a private containerd's).
	Kind string `json:"kind"`
	// Name is the network's Name, the namespace's or the link's name.
	Name string `json:"name"`
	// StateDir and HostNetNS are a network's (NetworkOptions), to remove it.
	StateDir  string `json:"stateDir,omitempty"`
	HostNetNS string `json:"hostNetNS,omitempty"`
	Pid       int    `json:"pid"`
	Start     uint64 `json:"start"`
	// Label is $VOYAGER_HOST_OWNER of the creating process.
	Label string `json:"label,omitempty"`
}

// file is where o is recorded.
func (o Owner) file() string {
	return filepath.Join(OwnersDir, o.Kind+"-"+o.Name+".json")
}

// Alive reports whether the process that recorded o still runs.
func (o Owner) Alive() bool {
	st, err := ProcessStart(o.Pid)
	return err == nil && st == o.Start
}

// RecordOwner records that this process created the host object kind/name.
// A failure to record is returned; callers treat it as advisory (the object
// works without it, a sweep just cannot prove it is a leftover).
func RecordOwner(o Owner) error {
	o.Pid = os.Getpid()
	st, err := ProcessStart(o.Pid)
	if err != nil {
		return fmt.Errorf("record owner of %s %s: %w", o.Kind, o.Name, err)
	}
	o.Start, o.Label = st, os.Getenv(EnvHostOwner)
	b, err := json.Marshal(o)
	if err != nil {
		return fmt.Errorf("record owner of %s %s: %w", o.Kind, o.Name, err)
	}
	if err := os.MkdirAll(OwnersDir, 0o700); err != nil {
		return fmt.Errorf("record owner of %s %s: %w", o.Kind, o.Name, err)
	}
	tmp := o.file() + ".tmp" + strconv.Itoa(o.Pid)
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("record owner of %s %s: %w", o.Kind, o.Name, err)
	}
	if err := os.Rename(tmp, o.file()); err != nil {
		return fmt.Errorf("record owner of %s %s: %w", o.Kind, o.Name, err)
	}
	return nil
}

// ForgetOwner removes the record of kind/name (the object is gone).
func ForgetOwner(kind, name string) error {
	err := os.Remove(Owner{Kind: kind, Name: name}.file())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("forget owner of %s %s: %w", kind, name, err)
	}
	return nil
}

// Owners lists the records in OwnersDir; unreadable ones are skipped.
func Owners() ([]Owner, error) {
	entries, err := os.ReadDir(OwnersDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list owners: %w", err)
	}
	var out []Owner
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(OwnersDir, e.Name()))
		if err != nil {
			continue
		}
		var o Owner
		if json.Unmarshal(b, &o) == nil && o.Kind != "" && o.Name != "" {
			out = append(out, o)
		}
	}
	return out, nil
}

// ProcessStart is the start time of process pid in clock ticks since boot
// (field 22 of /proc/<pid>/stat): with the pid, it names one process.
func ProcessStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("read start of process %d: %w", pid, err)
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("read start of process %d: malformed stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, fmt.Errorf("read start of process %d: malformed stat", pid)
	}
	v, err := strconv.ParseUint(f[19], 10, 64) // field 22 is the 20th after ')'
	if err != nil {
		return 0, fmt.Errorf("read start of process %d: %w", pid, err)
	}
	return v, nil
}
