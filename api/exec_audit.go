package api

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/voyager-gpu/voyager/internal/audit"
)

// ExecRecord is one line of the exec audit log: someone ran a command in,
// or forwarded a connection to, a session. The API writes a "start"
// record before it opens the stream (an exec whose record cannot be
// written does not run) and an "end" record when the stream ends.
type ExecRecord struct {
	Time time.Time `json:"time"`
	// Event is "start" or "end".
	Event string `json:"event"`
	// Stream identifies the exec or connection: its start and end share it.
	Stream string `json:"stream"`
	// Action is "exec" or "port-forward".
	Action string `json:"action"`
	// Subject is who (the token's sub); Admin whether they acted as an
	// admin on someone else's session.
	Subject string `json:"subject"`
	Admin   bool   `json:"admin,omitempty"`
	// Remote is the client's address as the API saw it.
	Remote  string `json:"remote,omitempty"`
	Session string `json:"session"`
	Owner   string `json:"owner"`
	Node    string `json:"node,omitempty"`
	// Command and TTY are an exec's; Port a port-forward's.
	Command []string `json:"command,omitempty"`
	TTY     bool     `json:"tty,omitempty"`
	Port    int      `json:"port,omitempty"`
	// ExitCode (end only) is the command's exit code, -1 when it did not
	// run to an exit; Error why; Seconds how long the stream lasted.
	ExitCode *int    `json:"exitCode,omitempty"`
	Error    string  `json:"error,omitempty"`
	Seconds  float64 `json:"seconds,omitempty"`
}

// execAudit appends ExecRecords as JSON lines to a file (when one is
// configured) and always to the API's log.
type execAudit struct {
	path string
	mu   sync.Mutex
	f    *os.File
}

// write records r. It fails only when the file cannot be written; the
// caller then refuses the exec.
func (a *API) auditExec(r ExecRecord) error {
	r.Time = a.cfg.Now().UTC()
	a.log.Info("exec audit", "event", r.Event, "stream", r.Stream, "action", r.Action, "subject", r.Subject, "admin", r.Admin,
		"session", r.Session, "owner", r.Owner, "node", r.Node, "command", r.Command, "tty", r.TTY, "port", r.Port,
		"exit_code", r.ExitCode, "error", r.Error, "remote", r.Remote)
	if err := a.auditExecRecord(r); err != nil {
		return err
	}
	ea := a.execAudit
	if ea == nil || ea.path == "" {
		return nil
	}
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode exec audit record: %w", err)
	}
	ea.mu.Lock()
	defer ea.mu.Unlock()
	if ea.f == nil {
		if err := os.MkdirAll(filepath.Dir(ea.path), 0o700); err != nil {
			return fmt.Errorf("create exec audit directory: %w", err)
		}
		f, err := os.OpenFile(ea.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return fmt.Errorf("open exec audit log: %w", err)
		}
		ea.f = f
	}
	if _, err := ea.f.Write(append(b, '\n')); err != nil {
		// Reopen next time: the file may have been rotated away.
		_ = ea.f.Close()
		ea.f = nil
		return fmt.Errorf("write exec audit log: %w", err)
	}
	return nil
}

// auditExecRecord writes r into the API's audit log (Config.Audit, the
// one admins read with voyager audit) as action session.exec.start,
// session.exec.end, session.port-forward.start or …end: an exec is a GET
// (a WebSocket upgrade), which the audit middleware of state-changing calls
// does not record. A start that cannot be recorded refuses the exec, as
// with the exec log's own file.
func (a *API) auditExecRecord(r ExecRecord) error {
	if a.cfg.Audit == nil {
		return nil
	}
	outcome := audit.OK
	if r.Error != "" {
		outcome = audit.Failed
	}
	fields := map[string]string{"stream": r.Stream, "owner": r.Owner}
	if r.Node != "" {
		fields["node"] = r.Node
	}
	if len(r.Command) > 0 {
		b, _ := json.Marshal(r.Command)
		fields["command"] = string(b)
	}
	if r.TTY {
		fields["tty"] = "true"
	}
	if r.Port != 0 {
		fields["port"] = strconv.Itoa(r.Port)
	}
	if r.ExitCode != nil {
		fields["exitCode"] = strconv.Itoa(*r.ExitCode)
	}
	if r.Seconds > 0 {
		fields["seconds"] = strconv.FormatFloat(r.Seconds, 'f', 3, 64)
	}
	rec := audit.Record{Time: r.Time, Actor: r.Subject, Admin: r.Admin, Action: "session." + r.Action + "." + r.Event,
		Target: r.Session, Outcome: outcome, Detail: r.Error, Remote: r.Remote, Fields: fields}
	if err := a.cfg.Audit.Write(rec); err != nil {
		return fmt.Errorf("write audit log: %w", err)
	}
	return nil
}
