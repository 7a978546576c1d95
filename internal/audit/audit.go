package audit

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of a record.
const (
	// OK: the call did what it asked (a 2xx or 3xx answer).
	OK = "ok"
	// Refused: the caller was told no (a 4xx answer: not authenticated,
	// not allowed, invalid, conflict, not found).
	Refused = "refused"
	// Failed: the call could not be done (a 5xx answer, or a stream that
	// broke).
	Failed = "failed"
)

// OutcomeOf is the outcome of an HTTP status code.
func OutcomeOf(status int) string {
	switch {
	case status >= 500:
		return Failed
	case status >= 400:
		return Refused
	default:
		return OK
	}
}

// Record is one line of the audit log.
type Record struct {
	// Time is when the call was received (UTC).
	Time time.Time `json:"time"`
	// Actor is who authenticated: a user's subject, or the service
	// (JupyterHub's token) that acts for OnBehalfOf. Empty when the call
	// was refused before a token was verified.
	Actor string `json:"actor"`
	// OnBehalfOf is the user a service token acted for, if any.
	OnBehalfOf string `json:"onBehalfOf,omitempty"`
	// Admin is true when the actor had the admin role.
	Admin bool `json:"admin,omitempty"`
	// Action names what was asked, such as session.create or
	// quota.put (the API's route table), or METHOD /route for a route
	// that has no name.
	Action string `json:"action"`
	// Method and Path are the HTTP request's.
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
	// Target is the object acted on: a session or array id, a node,
	// profile, volume or quota name.
	Target string `json:"target,omitempty"`
	// Outcome is OK, Refused or Failed; Status the HTTP status code.
	Outcome string `json:"outcome"`
	Status  int    `json:"status,omitempty"`
	// Detail says why a call was refused or failed (the problem's
	// detail, cut to 512 bytes).
	Detail string `json:"detail,omitempty"`
	// Remote is the caller's address.
	Remote string `json:"remote,omitempty"`
	// DurationMS is how long the call took, in milliseconds.
	DurationMS float64 `json:"durationMs"`
	// Fields are what the handler added: an exec's command, a drain's
	// deadline. Never secret values.
	Fields map[string]string `json:"fields,omitempty"`
}

// Options configure a Log. Path is required.
type Options struct {
	// Path is the file written; rotated files are Path.1 (the newest) to
	// Path.<Keep>.
	Path string
	// MaxBytes is the size past which the file is rotated. Default 64 MiB.
	MaxBytes int64
	// Keep is how many rotated files are kept. Default 8.
	Keep int
	// Sync, when set, makes each write durable (fsync) before Write
	// returns.
	Sync bool
}

// Log is an append-only audit log. Its methods are safe for concurrent
// use.
type Log struct {
	opt Options

	mu   sync.Mutex
	f    *os.File
	size int64

	records *prometheus.CounterVec
	errors  prometheus.Counter
}

// Open opens (creating it and its directory, mode 0700/0600) the log at
// o.Path for appending.
func Open(o Options) (*Log, error) {
	if o.Path == "" {
		return nil, errors.New("open audit log: no path")
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = 64 << 20
	}
	if o.Keep <= 0 {
		o.Keep = 8
	}
	l := &Log{
		opt: o,
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "voyager_audit_records_total",
			Help: "Audit records written, by action (session.create, quota.put, …) and outcome (ok, refused, failed).",
		}, []string{"action", "outcome"}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "voyager_audit_write_errors_total",
			Help: "Audit records that could not be written to the audit log (each is also logged as an error).",
		}),
	}
	if err := os.MkdirAll(filepath.Dir(o.Path), 0o700); err != nil {
		return nil, fmt.Errorf("open audit log: %w", err)
	}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Log) open() error {
	f, err := os.OpenFile(l.opt.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open audit log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("open audit log: %w", err)
	}
	l.f, l.size = f, st.Size()
	return nil
}

// Path is the file the log writes.
func (l *Log) Path() string { return l.opt.Path }

// Collectors returns the log's Prometheus collectors.
func (l *Log) Collectors() []prometheus.Collector {
	return []prometheus.Collector{l.records, l.errors}
}

// Write appends r as one line, rotating the file first when the line
// would take it past MaxBytes. A record is counted whether or not it could
// be written; a write that fails is counted as an error as well.
func (l *Log) Write(r Record) error {
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	r.Time = r.Time.UTC()
	l.records.WithLabelValues(r.Action, r.Outcome).Inc()
	b, err := json.Marshal(r)
	if err != nil {
		l.errors.Inc()
		return fmt.Errorf("encode audit record: %w", err)
	}
	b = append(b, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.write(b); err != nil {
		l.errors.Inc()
		return err
	}
	return nil
}

func (l *Log) write(b []byte) error {
	if l.f == nil {
		return errors.New("write audit record: the log is closed")
	}
	if l.size > 0 && l.size+int64(len(b)) > l.opt.MaxBytes {
		if err := l.rotate(); err != nil {
			return err
		}
	}
	n, err := l.f.Write(b)
	l.size += int64(n)
	if err != nil {
		return fmt.Errorf("write audit record: %w", err)
	}
	if l.opt.Sync {
		if err := l.f.Sync(); err != nil {
			return fmt.Errorf("sync audit log: %w", err)
		}
	}
	return nil
}

// rotate renames Path.i to Path.i+1 (dropping the oldest), Path to
// Path.1, and opens a new Path.
func (l *Log) rotate() error {
	if err := l.f.Close(); err != nil {
		return fmt.Errorf("rotate audit log: %w", err)
	}
	l.f = nil
	p := l.opt.Path
	_ = os.Remove(p + "." + strconv.Itoa(l.opt.Keep))
	for i := l.opt.Keep - 1; i >= 1; i-- {
		if err := os.Rename(p+"."+strconv.Itoa(i), p+"."+strconv.Itoa(i+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("rotate audit log: %w", err)
		}
	}
	if err := os.Rename(p, p+".1"); err != nil {
		return fmt.Errorf("rotate audit log: %w", err)
	}
	return l.open()
}

// Close closes the file; later writes fail.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// Filter selects records. Zero fields select everything.
type Filter struct {
	// Since and Until bound Time (Since inclusive, Until exclusive).
	Since, Until time.Time
	// Actor matches Actor or OnBehalfOf.
	Actor string
	// Action matches Action exactly, or as a prefix when it ends in
	// '.' ("session." selects every session action).
	Action string
	// Target matches Target exactly.
	Target string
	// Outcome matches Outcome.
	Outcome string
	// Limit keeps the newest Limit matches. Default 1000.
	Limit int
}

func (f Filter) match(r Record) bool {
	switch {
	case !f.Since.IsZero() && r.Time.Before(f.Since):
		return false
	case !f.Until.IsZero() && !r.Time.Before(f.Until):
		return false
	case f.Actor != "" && r.Actor != f.Actor && r.OnBehalfOf != f.Actor:
		return false
	case f.Target != "" && r.Target != f.Target:
		return false
	case f.Outcome != "" && r.Outcome != f.Outcome:
		return false
	case f.Action != "" && !(r.Action == f.Action || strings.HasSuffix(f.Action, ".") && strings.HasPrefix(r.Action, f.Action)):
		return false
	}
	return true
}

// Read returns the newest f.Limit records that match f, oldest first,
// from the rotated files and the current one, and whether older matches
// were left out. A line that is not a record (a torn write after a crash)
// is skipped.
func (l *Log) Read(f Filter) ([]Record, bool, error) {
	if f.Limit <= 0 {
		f.Limit = 1000
	}
	// Writes wait while the files are read, so a rotation cannot move a
	// file from under the reader; reads are an admin's, and rare.
	l.mu.Lock()
	defer l.mu.Unlock()
	var (
		ring []Record
		more bool
	)
	for i := l.opt.Keep; i >= 0; i-- {
		p := l.opt.Path
		if i > 0 {
			p += "." + strconv.Itoa(i)
		}
		file, err := os.Open(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, false, fmt.Errorf("read audit log: %w", err)
		}
		sc := bufio.NewScanner(file)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			var r Record
			if json.Unmarshal(sc.Bytes(), &r) != nil || !f.match(r) {
				continue
			}
			if len(ring) == f.Limit {
				ring = ring[1:]
				more = true
			}
			ring = append(ring, r)
		}
		err = sc.Err()
		file.Close()
		if err != nil {
			return nil, false, fmt.Errorf("read audit log %s: %w", p, err)
		}
	}
	if ring == nil {
		ring = []Record{}
	}
	return ring, more, nil
}
