package state

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// dirArrays holds job arrays (see Array).
const dirArrays = "arrays"

// Arrays is the prefix of every job array.
func (k Keys) Arrays() string { return k.dir(dirArrays) }

// Array is the key of job array id.
func (k Keys) Array(id string) string { return k.key(dirArrays, id) }

// ArrayID returns the array id of a key under arrays/, and false for any
// other key.
func (k Keys) ArrayID(key string) (string, bool) {
	if !k.hasDir(dirArrays, key) {
		return "", false
	}
	id := k.trimDir(dirArrays, key)
	return id, id != "" && !strings.Contains(id, "/")
}

// MaxArrayElements bounds the elements of one array, so that its record,
// which keeps every finished element's result and is rewritten as they
// finish, stays small (about 60 bytes a result): Slurm's default
// MaxArraySize is about the same.
const MaxArrayElements = 1000

// Environment variables every array element gets.
const (
	EnvArrayID    = "VOYAGER_ARRAY_ID"
	EnvArrayIndex = "VOYAGER_ARRAY_INDEX"
	EnvArraySize  = "VOYAGER_ARRAY_SIZE"
	EnvArrayParam = "VOYAGER_ARRAY_PARAM" // only for arrays of a parameter list
)

// Placeholders substituted in an element's command and environment values.
const (
	PlaceholderIndex = "{index}"
	PlaceholderParam = "{param}"
)

// ArrayMember marks a session as an element of a job array.
type ArrayMember struct {
	ID    string `json:"id"`
	Index int    `json:"index"`
}

// Array is a job array, stored at arrays/<id>: one submission of many
// batch sessions made from one template, of which at most MaxRunning are
// unfinished at any moment. The API writes it whole on create and sets
// Stop; the array controller (package sweep) creates the elements, Next
// at a time, and folds each finished element's result into Done, in
// transactions that compare the record's mod revision.
type Array struct {
	ID     string   `json:"id"`
	Owner  string   `json:"owner"`
	Groups []string `json:"groups,omitempty"`
	// Template is the spec every element is made from (its ID empty);
	// {index} and {param} in its command and environment values are
	// replaced per element.
	Template Session `json:"template"`
	// Indices is the index set as submitted: "0-99", "0-99:10", "1,5,7-9".
	// For an array of Params it is "0-<len-1>".
	Indices string `json:"indices"`
	// Params, when set, are one value per element: element i gets
	// Params[i] as {param} and VOYAGER_ARRAY_PARAM.
	Params []string `json:"params,omitempty"`
	// MaxRunning caps the elements that are unfinished (created and not
	// yet in a terminal phase) at once.
	MaxRunning int       `json:"maxRunning"`
	Created    time.Time `json:"created"`
	// Next is how many elements exist: those of the first Next indices.
	Next int `json:"next"`
	// Done is each finished element's result, by index (decimal).
	Done map[string]ElementResult `json:"done,omitempty"`
	// Stop, when set, is the owner's stop: no more elements are created
	// and every unfinished one is stopped.
	Stop *ArrayStop `json:"stop,omitempty"`
	// Finished is when the last element ended.
	Finished *time.Time `json:"finished,omitempty"`
}

// ArrayStop records who stopped an array and when.
type ArrayStop struct {
	By string    `json:"by"`
	At time.Time `json:"at"`
}

// ElementResult is a finished element's outcome, kept in its array after
// the element's own records are retired. Its times are the element's
// status's (and, once retired, the history file's): the record is
// rewritten as elements finish, so it keeps only what the summary needs.
type ElementResult struct {
	Phase    Phase  `json:"phase"`
	Reason   string `json:"reason,omitempty"`
	ExitCode *int   `json:"exitCode,omitempty"`
	Attempt  int    `json:"attempt,omitempty"`
}

// ParseIndexSet reads an index set: comma-separated items, each N, A-B
// (inclusive) or A-B:S (every S-th from A), with indices from 0 to
// 999999, no index twice and at most MaxArrayElements in all.
func ParseIndexSet(s string) ([]int, error) {
	const maxIndex = 999999
	want := `want items such as "0-99", "0-99:10" or "1,5,7-9" (indices 0-999999, at most 1000 of them)`
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("parse index set: empty; %s", want)
	}
	var out []int
	seen := map[int]bool{}
	num := func(t string) (int, error) {
		n, err := strconv.Atoi(strings.TrimSpace(t))
		if err != nil || n < 0 || n > maxIndex {
			return 0, fmt.Errorf("parse index set %q: %q is no index; %s", s, t, want)
		}
		return n, nil
	}
	for _, item := range strings.Split(s, ",") {
		rng, stepS, hasStep := strings.Cut(item, ":")
		a, b, isRange := strings.Cut(rng, "-")
		lo, err := num(a)
		if err != nil {
			return nil, err
		}
		hi, step := lo, 1
		if isRange {
			if hi, err = num(b); err != nil {
				return nil, err
			}
			if hi < lo {
				return nil, fmt.Errorf("parse index set %q: range %q runs backwards; %s", s, item, want)
			}
		}
		if hasStep {
			if !isRange {
				return nil, fmt.Errorf("parse index set %q: a step needs a range, as in 0-99:10", s)
			}
			if step, err = strconv.Atoi(strings.TrimSpace(stepS)); err != nil || step < 1 {
				return nil, fmt.Errorf("parse index set %q: step %q: want a whole number of at least 1", s, stepS)
			}
		}
		for i := lo; i <= hi; i += step {
			if seen[i] {
				return nil, fmt.Errorf("parse index set %q: index %d appears twice; want each index once", s, i)
			}
			if len(out) == MaxArrayElements {
				return nil, fmt.Errorf("parse index set %q: more than %d elements; split the sweep", s, MaxArrayElements)
			}
			seen[i] = true
			out = append(out, i)
		}
	}
	return out, nil
}

// Size returns how many elements the array has.
func (a Array) Size() (int, error) {
	ix, err := ParseIndexSet(a.Indices)
	return len(ix), err
}

// ElementID is the session id of element index of array id.
func ElementID(id string, index int) string { return id + "-" + strconv.Itoa(index) }

// ElementIndex returns the index of a session id of array id's elements,
// and false for an id that is none.
func ElementIndex(arrayID, session string) (int, bool) {
	rest, ok := strings.CutPrefix(session, arrayID+"-")
	if !ok || rest == "" || (len(rest) > 1 && rest[0] == '0') {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil && n >= 0
}

// ElementOf returns the array id and index of a session id that names an
// array element (<array id>-<index>), and false for any other id. Array
// ids have no '-' (NewSessionID), so the split is unambiguous.
func ElementOf(session string) (string, int, bool) {
	i := strings.LastIndexByte(session, '-')
	if i <= 0 {
		return "", 0, false
	}
	n, ok := ElementIndex(session[:i], session)
	return session[:i], n, ok
}

// Element builds the spec of the element at position pos of the index
// set ix: the template with its id, the array's environment variables and
// {index} and {param} replaced.
func (a Array) Element(ix []int, pos int, now time.Time) Session {
	idx := ix[pos]
	s := a.Template
	s.ID = ElementID(a.ID, idx)
	s.Owner, s.Groups = a.Owner, a.Groups
	s.Created, s.Desired, s.Eviction = now, DesiredRunning, nil
	s.Array = &ArrayMember{ID: a.ID, Index: idx}
	param := ""
	if a.Params != nil {
		param = a.Params[pos]
	}
	r := strings.NewReplacer(PlaceholderIndex, strconv.Itoa(idx), PlaceholderParam, param)
	s.Command = make([]string, len(a.Template.Command))
	for i, c := range a.Template.Command {
		s.Command[i] = r.Replace(c)
	}
	s.Env = make(map[string]string, len(a.Template.Env)+4)
	for k, v := range a.Template.Env {
		s.Env[k] = r.Replace(v)
	}
	s.Env[EnvArrayID] = a.ID
	s.Env[EnvArrayIndex] = strconv.Itoa(idx)
	s.Env[EnvArraySize] = strconv.Itoa(len(ix))
	if a.Params != nil {
		s.Env[EnvArrayParam] = param
	}
	return s
}

// Unfinished is how many elements exist and have not ended.
func (a Array) Unfinished() int { return a.Next - len(a.Done) }

// CreateArray writes a new array record in one transaction, on condition
// that the id is new and every guard holds (the revisions of the volume
// definitions its template was resolved from); it creates no element (the
// controller does). It returns ErrExists when the id is taken and
// ErrConflict when a guard failed, writing nothing either way.
func CreateArray(ctx context.Context, kv clientv3.KV, k Keys, a Array, guards ...clientv3.Cmp) error {
	ops, err := arrayOps(k, a)
	if err != nil {
		return err
	}
	resp, err := kv.Txn(ctx).If(append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k.Array(a.ID)), "=", 0)}, guards...)...).
		Then(ops...).
		Else(clientv3.OpGet(k.Array(a.ID), clientv3.WithCountOnly())).Commit()
	if err != nil {
		return fmt.Errorf("create array %s: %w", a.ID, err)
	}
	if !resp.Succeeded {
		if resp.Responses[0].GetResponseRange().GetCount() > 0 {
			return fmt.Errorf("create array %s: %w", a.ID, ErrExists)
		}
		return fmt.Errorf("create array %s: a guard changed: %w", a.ID, ErrConflict)
	}
	return nil
}

// CreateArrayIdempotent is CreateArray that also writes idem's record (its
// Array set to a.ID), in the same transaction and only if its key does not
// exist yet: two creates with one key never make two arrays, however they
// interleave. When the key exists, nothing is written and the stored
// record is returned with created false: the caller answers the repeat
// with it (the first array, or a refusal when the record's body digest or
// kind differs).
func CreateArrayIdempotent(ctx context.Context, kv clientv3.KV, k Keys, a Array, idem Idempotency, guards ...clientv3.Cmp) (stored IdempotencyRecord, created bool, err error) {
	ops, err := arrayOps(k, a)
	if err != nil {
		return IdempotencyRecord{}, false, err
	}
	stored, created, err = createIdempotent(ctx, kv, k.Array(a.ID), ops, idem, guards)
	if err != nil {
		return IdempotencyRecord{}, false, fmt.Errorf("create array %s: %w", a.ID, err)
	}
	return stored, created, nil
}

// arrayOps are the writes of a new array: its record, with the
// template's environment values moved to specsecrets/<array id>
// (SplitSpecSecrets), and that secrets record.
func arrayOps(k Keys, a Array) ([]clientv3.Op, error) {
	var sec *SpecSecrets
	a.Template, sec = SplitSpecSecrets(a.Template)
	v, err := encodeArray(a)
	if err != nil {
		return nil, err
	}
	ops := []clientv3.Op{clientv3.OpPut(k.Array(a.ID), v)}
	if sec != nil {
		sec.Session = a.ID
		sv, err := Encode(sec)
		if err != nil {
			return nil, fmt.Errorf("create array: %w", err)
		}
		ops = append(ops, clientv3.OpPut(k.SpecSecrets(a.ID), sv))
	}
	return ops, nil
}

// encodeArray checks a new array's id and encodes its record.
func encodeArray(a Array) (string, error) {
	if err := ValidateName("array id", a.ID); err != nil {
		return "", fmt.Errorf("create array: %w", err)
	}
	v, err := Encode(a)
	if err != nil {
		return "", fmt.Errorf("create array: %w", err)
	}
	return v, nil
}

// ArrayStepSize is the size of an AdvanceArray transaction that creates n
// elements and writes bytes of values; with secrets, each element gets
// its secrets record too (a fourth key: environment values, a Ray
// session's token; NeedsSecrets).
func ArrayStepSize(n, bytes int, secrets bool) TxnSize {
	per := 3
	if secrets {
		per = 4
	}
	return TxnSize{Compares: 1 + n, Then: 1 + per*n, Bytes: bytes}
}

// AdvanceArray writes a's new record and creates the sessions create (each
// spec, queue entry and Pending status, and a Ray session's token, as
// CreateSession) in one
// transaction, on condition that the record is still at rev and no
// element exists yet. It returns ErrConflict, writing nothing, otherwise.
//
// The caller decides create from the record at rev (Next, Done, Stop)
// and from element statuses it read: a terminal phase never changes
// again (the state machine has no edge out of one), so a status read as
// terminal is still terminal at commit, and the record's revision is the
// only thing the decision can be stale on.
func AdvanceArray(ctx context.Context, kv clientv3.KV, k Keys, a Array, rev int64, create []Session, now time.Time) error {
	v, err := Encode(a)
	if err != nil {
		return fmt.Errorf("advance array %s: %w", a.ID, err)
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k.Array(a.ID)), "=", rev)}
	ops := []clientv3.Op{clientv3.OpPut(k.Array(a.ID), v)}
	for _, s := range create {
		s, ray, err := secretOps(k, s)
		if err != nil {
			return fmt.Errorf("advance array %s: %w", a.ID, err)
		}
		spec, entry, st, err := encodeNew(s, now)
		if err != nil {
			return fmt.Errorf("advance array %s: %w", a.ID, err)
		}
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k.Session(s.ID)), "=", 0))
		ops = append(ops, createOps(k, s.ID, spec, entry, st)...)
		ops = append(ops, ray...)
	}
	resp, err := kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("advance array %s: %w", a.ID, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("advance array %s: %w", a.ID, ErrConflict)
	}
	return nil
}

// StopArray sets a's Stop (by, now) on condition that the record is at
// rev, and returns the record written. It returns ErrConflict when it
// moved, and the record unchanged when it was already stopped.
func StopArray(ctx context.Context, kv clientv3.KV, k Keys, a Array, rev int64, by string, now time.Time) (Array, error) {
	if a.Stop != nil {
		return a, nil
	}
	a.Stop = &ArrayStop{By: by, At: now}
	a.Done = maps.Clone(a.Done)
	if err := AdvanceArray(ctx, kv, k, a, rev, nil, now); err != nil {
		return Array{}, fmt.Errorf("stop array: %w", err)
	}
	return a, nil
}

// RetireArray deletes array id's record (and its template's secrets),
// read at rev, on condition that it
// is still at rev and that no element of it has a spec or a status left:
// the retention sweeper retires a finished array's elements first, so an
// array never leaves etcd while an element it counts is there. It returns
// ErrConflict, deleting nothing, otherwise.
func RetireArray(ctx context.Context, kv clientv3.KV, k Keys, id string, rev int64) error {
	none := func(prefix string) clientv3.Cmp {
		return clientv3.Compare(clientv3.CreateRevision(prefix), "=", 0).WithPrefix()
	}
	resp, err := kv.Txn(ctx).If(
		clientv3.Compare(clientv3.ModRevision(k.Array(id)), "=", rev),
		none(k.Status(id+"-")),
		none(k.Session(id+"-")),
	).Then(clientv3.OpDelete(k.Array(id)), clientv3.OpDelete(k.SpecSecrets(id))).Commit()
	if err != nil {
		return fmt.Errorf("retire array %s: %w", id, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("retire array %s: %w", id, ErrConflict)
	}
	return nil
}

// ResultOf is the result an element ended with, from its final status.
func ResultOf(st Status) ElementResult {
	return ElementResult{Phase: st.Phase, Reason: st.Reason, ExitCode: st.ExitCode, Attempt: st.Attempt}
}

// ArraySummary counts an array's elements by where they are.
type ArraySummary struct {
	// Size is the number of elements; Created how many exist so far.
	Size    int `json:"size"`
	Created int `json:"created"`
	// Succeeded, Failed (Failed or Lost), Stopped: elements that ended so.
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
	Stopped   int `json:"stopped"`
	// Running are elements bound, starting, running or stopping; Pending
	// those queued (or waiting to restart).
	Running int `json:"running"`
	Pending int `json:"pending"`
	// Waiting are elements not created yet, held back by the cap; Skipped
	// those never to be created because the array was stopped.
	Waiting int `json:"waiting"`
	Skipped int `json:"skipped"`
	// Phases counts the created elements by phase.
	Phases map[Phase]int `json:"phases"`
	// Done: every element ended (or was skipped).
	Done bool `json:"done"`
}

// Summarize counts a's elements: finished ones from a.Done, unfinished
// ones from live, their statuses by index.
func Summarize(a Array, size int, live map[int]Status) ArraySummary {
	s := ArraySummary{Size: size, Created: a.Next, Phases: map[Phase]int{}}
	count := func(p Phase) {
		s.Phases[p]++
		switch p {
		case PhaseSucceeded:
			s.Succeeded++
		case PhaseFailed, PhaseLost:
			s.Failed++
		case PhaseStopped:
			s.Stopped++
		case PhaseBound, PhaseStarting, PhaseRunning, PhaseStopping:
			s.Running++
		case PhasePending:
			s.Pending++
		}
	}
	for _, r := range a.Done {
		count(r.Phase)
	}
	for _, st := range live {
		count(st.Phase)
	}
	if a.Stop != nil {
		s.Skipped = size - a.Next
	} else {
		s.Waiting = size - a.Next
	}
	s.Done = a.Finished != nil
	return s
}
