package fence

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// containerOf returns which of ids the cgroup file of a process names
// (its last path element, as containerd's cgroupfs paths /<namespace>/<id>
// end, or a systemd scope ending in -<id>.scope), or "".
func containerOf(cgroup []byte, ids map[string]bool) string {
	sc := bufio.NewScanner(bytes.NewReader(cgroup))
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ':')
		if i < 0 {
			continue
		}
		last := filepath.Base(line[i+1:])
		if ids[last] {
			return last
		}
		if base, ok := strings.CutSuffix(last, ".scope"); ok {
			for id := range ids {
				if strings.HasSuffix(base, "-"+id) {
					return id
				}
			}
		}
	}
	return ""
}

// processes maps each of ids to the live (not zombie) processes of
// proc (/proc) whose cgroup is that container's.
func processes(proc string, ids map[string]bool) (map[string][]int, error) {
	out := map[string][]int{}
	if len(ids) == 0 {
		return out, nil
	}
	ents, err := os.ReadDir(proc)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		id := processContainer(proc, pid, ids)
		if id == "" || zombie(proc, pid) {
			continue
		}
		out[id] = append(out[id], pid)
	}
	return out, nil
}

func processContainer(proc string, pid int, ids map[string]bool) string {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return "" // gone meanwhile
	}
	return containerOf(b, ids)
}

// zombie reports whether pid has exited and waits to be reaped (or is
// gone): nothing left to signal.
func zombie(proc string, pid int) bool {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "stat"))
	if err != nil {
		return true
	}
	// pid (comm) S ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return true
	}
	return b[i+2] == 'Z' || b[i+2] == 'X'
}

// signal sends sig to pid if it still belongs to container id: through a
// pidfd, opened and then checked against the process's cgroup, so that a
// pid reused by another process between the scan and the signal is never
// hit.
func signal(proc string, pid int, id string, sig syscall.Signal) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open pidfd of %d: %w", pid, err)
	}
	defer unix.Close(fd)
	if processContainer(proc, pid, map[string]bool{id: true}) != id {
		return nil // exited, and the pid is another process's now
	}
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signal %d: %w", pid, err)
	}
	return nil
}

// alive reports whether process pid exists.
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}
