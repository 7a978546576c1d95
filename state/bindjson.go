package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The bind transaction writes a ledger per node, a binding per part and a
// status per session: a placer's burst encodes thousands of them a second
// on the cores etcd needs. The functions below append exactly the JSON
// that encoding/json (Encode) writes for Status, Binding and Ledger,
// without reflection, so that BindOps can encode a whole transaction into
// one buffer. encoding/json stays the definition: bindjson_test.go
// compares both on randomized values of every field, and each type's
// fields as the encoder knows them are checked once at start (fastJSON),
// so a field added to one of these types makes BindOps fall back to
// Encode until the encoder here learns it (a test fails until then).

// Field lists the hand-written encoders were written for: Go name, Go
// type and json tag of each field, in order.
const (
	statusShape = "Session string session|Phase state.Phase phase|Reason string reason,omitempty|Message string message,omitempty|" +
		"QueuePosition int queuePosition,omitempty|Nodes []string nodes,omitempty|URLs map[string]string urls,omitempty|" +
		"ExitCode *int exitCode,omitempty|Attempt int attempt,omitempty|QueueRevision int64 queueRevision,omitempty|" +
		"Created time.Time created|Updated time.Time updated|Bound *time.Time bound,omitempty|Started *time.Time started,omitempty|" +
		"Finished *time.Time finished,omitempty|RetryAt *time.Time retryAt,omitempty|Activity *state.Activity activity,omitempty|"
	bindingShape = "Session string session|Node string node|Role state.Role role|Worker int worker,omitempty|" +
		"GPUs []string gpus,omitempty|CPUMilli int64 cpuMilli|MemoryMiB int64 memoryMiB|Ports []int ports,omitempty|" +
		"HeadNode string headNode,omitempty|QueueRevision int64 queueRevision|Attempt int attempt|" +
		"Scores map[string]float64 scores,omitempty|Placer string placer,omitempty|Bound time.Time bound|"
	ledgerShape     = "Node string node|Allocations map[string]state.Allocation allocations|"
	allocationShape = "Kind state.SessionKind kind,omitempty|Owner string owner|Groups []string groups,omitempty|" +
		"Priority int priority|Preemptible bool preemptible,omitempty|Role state.Role role|GPUs []string gpus,omitempty|" +
		"CPUMilli int64 cpuMilli|MemoryMiB int64 memoryMiB|Ports []int ports,omitempty|Plan int64 plan,omitempty|" +
		"Queued time.Time queued,omitzero|"
)

// shapeOf lists t's fields as the constants above do.
func shapeOf(t reflect.Type) string {
	var sb strings.Builder
	for i := range t.NumField() {
		f := t.Field(i)
		fmt.Fprintf(&sb, "%s %s %s|", f.Name, f.Type, f.Tag.Get("json"))
	}
	return sb.String()
}

// fastJSON says, per type, whether the hand-written encoder knows every
// field the type has now.
var fastJSON = struct{ status, binding, ledger bool }{
	status:  shapeOf(reflect.TypeFor[Status]()) == statusShape,
	binding: shapeOf(reflect.TypeFor[Binding]()) == bindingShape,
	ledger: shapeOf(reflect.TypeFor[Ledger]()) == ledgerShape &&
		shapeOf(reflect.TypeFor[Allocation]()) == allocationShape,
}

// appendStatus, appendBinding and appendLedger append their value as
// Encode writes it: by hand while the encoder knows every field of the
// type (fastJSON), else by encoding/json.
func appendStatus(b []byte, s *Status) ([]byte, error) {
	if fastJSON.status {
		return appendStatusJSON(b, s)
	}
	return appendMarshal(b, *s)
}

func appendBinding(b []byte, x *Binding) ([]byte, error) {
	if fastJSON.binding {
		return appendBindingJSON(b, x)
	}
	return appendMarshal(b, *x)
}

func appendLedger(b []byte, l *Ledger) ([]byte, error) {
	if fastJSON.ledger {
		return appendLedgerJSON(b, l)
	}
	return appendMarshal(b, *l)
}

// appendMarshal appends v as encoding/json writes it.
func appendMarshal(b []byte, v any) ([]byte, error) {
	j, err := json.Marshal(v)
	if err != nil {
		return b, fmt.Errorf("encode %T: %w", v, err)
	}
	return append(b, j...), nil
}

func appendStatusJSON(b []byte, s *Status) ([]byte, error) {
	var err error
	b = append(b, `{"session":`...)
	b = appendJSONString(b, s.Session)
	b = append(b, `,"phase":`...)
	b = appendJSONString(b, string(s.Phase))
	if s.Reason != "" {
		b = append(b, `,"reason":`...)
		b = appendJSONString(b, s.Reason)
	}
	if s.Message != "" {
		b = append(b, `,"message":`...)
		b = appendJSONString(b, s.Message)
	}
	if s.QueuePosition != 0 {
		b = append(b, `,"queuePosition":`...)
		b = strconv.AppendInt(b, int64(s.QueuePosition), 10)
	}
	if len(s.Nodes) > 0 {
		b = append(b, `,"nodes":`...)
		b = appendJSONStrings(b, s.Nodes)
	}
	if len(s.URLs) > 0 {
		b = append(b, `,"urls":`...)
		b = appendJSONStringMap(b, s.URLs)
	}
	if s.ExitCode != nil {
		b = append(b, `,"exitCode":`...)
		b = strconv.AppendInt(b, int64(*s.ExitCode), 10)
	}
	if s.Attempt != 0 {
		b = append(b, `,"attempt":`...)
		b = strconv.AppendInt(b, int64(s.Attempt), 10)
	}
	if s.QueueRevision != 0 {
		b = append(b, `,"queueRevision":`...)
		b = strconv.AppendInt(b, s.QueueRevision, 10)
	}
	b = append(b, `,"created":`...)
	if b, err = appendJSONTime(b, s.Created); err != nil {
		return b, err
	}
	b = append(b, `,"updated":`...)
	if b, err = appendJSONTime(b, s.Updated); err != nil {
		return b, err
	}
	for _, t := range [...]struct {
		name string
		t    *time.Time
	}{{`,"bound":`, s.Bound}, {`,"started":`, s.Started}, {`,"finished":`, s.Finished}, {`,"retryAt":`, s.RetryAt}} {
		if t.t != nil {
			b = append(b, t.name...)
			if b, err = appendJSONTime(b, *t.t); err != nil {
				return b, err
			}
		}
	}
	if s.Activity != nil {
		// Agents' samples: not written by a bind, left to encoding/json.
		b = append(b, `,"activity":`...)
		if b, err = appendMarshal(b, s.Activity); err != nil {
			return b, err
		}
	}
	return append(b, '}'), nil
}

func appendBindingJSON(b []byte, x *Binding) ([]byte, error) {
	var err error
	b = append(b, `{"session":`...)
	b = appendJSONString(b, x.Session)
	b = append(b, `,"node":`...)
	b = appendJSONString(b, x.Node)
	b = append(b, `,"role":`...)
	b = appendJSONString(b, string(x.Role))
	if x.Worker != 0 {
		b = append(b, `,"worker":`...)
		b = strconv.AppendInt(b, int64(x.Worker), 10)
	}
	b = appendHolding(b, x.GPUs, x.CPUMilli, x.MemoryMiB, x.Ports)
	if x.HeadNode != "" {
		b = append(b, `,"headNode":`...)
		b = appendJSONString(b, x.HeadNode)
	}
	b = append(b, `,"queueRevision":`...)
	b = strconv.AppendInt(b, x.QueueRevision, 10)
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(x.Attempt), 10)
	if len(x.Scores) > 0 {
		b = append(b, `,"scores":`...)
		if b, err = appendJSONObject(b, x.Scores, appendJSONFloat); err != nil {
			return b, err
		}
	}
	if x.Placer != "" {
		b = append(b, `,"placer":`...)
		b = appendJSONString(b, x.Placer)
	}
	b = append(b, `,"bound":`...)
	if b, err = appendJSONTime(b, x.Bound); err != nil {
		return b, err
	}
	return append(b, '}'), nil
}

func appendLedgerJSON(b []byte, l *Ledger) ([]byte, error) {
	b = append(b, `{"node":`...)
	b = appendJSONString(b, l.Node)
	b = append(b, `,"allocations":`...)
	b, err := appendJSONObject(b, l.Allocations, func(b []byte, a Allocation) ([]byte, error) { return appendAllocationJSON(b, &a) })
	if err != nil {
		return b, err
	}
	return append(b, '}'), nil
}

func appendAllocationJSON(b []byte, a *Allocation) ([]byte, error) {
	b = append(b, '{')
	if a.Kind != "" {
		b = append(b, `"kind":`...)
		b = appendJSONString(b, string(a.Kind))
		b = append(b, ',')
	}
	b = append(b, `"owner":`...)
	b = appendJSONString(b, a.Owner)
	if len(a.Groups) > 0 {
		b = append(b, `,"groups":`...)
		b = appendJSONStrings(b, a.Groups)
	}
	b = append(b, `,"priority":`...)
	b = strconv.AppendInt(b, int64(a.Priority), 10)
	if a.Preemptible {
		b = append(b, `,"preemptible":true`...)
	}
	b = append(b, `,"role":`...)
	b = appendJSONString(b, string(a.Role))
	b = appendHolding(b, a.GPUs, a.CPUMilli, a.MemoryMiB, a.Ports)
	if a.Plan != 0 {
		b = append(b, `,"plan":`...)
		b = strconv.AppendInt(b, a.Plan, 10)
	}
	if !a.Queued.IsZero() {
		b = append(b, `,"queued":`...)
		var err error
		if b, err = appendJSONTime(b, a.Queued); err != nil {
			return b, err
		}
	}
	return append(b, '}'), nil
}

// appendHolding writes what a binding and an allocation both hold, in
// the order and with the names both types give it.
func appendHolding(b []byte, gpus []string, cpuMilli, memoryMiB int64, ports []int) []byte {
	if len(gpus) > 0 {
		b = append(b, `,"gpus":`...)
		b = appendJSONStrings(b, gpus)
	}
	b = append(b, `,"cpuMilli":`...)
	b = strconv.AppendInt(b, cpuMilli, 10)
	b = append(b, `,"memoryMiB":`...)
	b = strconv.AppendInt(b, memoryMiB, 10)
	if len(ports) > 0 {
		b = append(b, `,"ports":`...)
		b = appendJSONInts(b, ports)
	}
	return b
}

// sortedKeys returns m's keys in the order encoding/json writes them,
// in buf when they fit.
func sortedKeys[V any](m map[string]V, buf []string) []string {
	keys := buf[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func appendJSONStringMap(b []byte, m map[string]string) []byte {
	b, _ = appendJSONObject(b, m, func(b []byte, v string) ([]byte, error) { return appendJSONString(b, v), nil })
	return b
}

// appendJSONObject writes m as a JSON object (nil as null), its keys in
// the order encoding/json writes them, each value by elem.
func appendJSONObject[V any](b []byte, m map[string]V, elem func([]byte, V) ([]byte, error)) ([]byte, error) {
	if m == nil {
		return append(b, "null"...), nil
	}
	b = append(b, '{')
	var buf [16]string
	for i, k := range sortedKeys(m, buf[:]) {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, k)
		b = append(b, ':')
		var err error
		if b, err = elem(b, m[k]); err != nil {
			return b, err
		}
	}
	return append(b, '}'), nil
}

func appendJSONStrings(b []byte, ss []string) []byte {
	return appendJSONArray(b, ss, appendJSONString)
}

func appendJSONInts(b []byte, xs []int) []byte {
	return appendJSONArray(b, xs, func(b []byte, x int) []byte { return strconv.AppendInt(b, int64(x), 10) })
}

// appendJSONArray writes xs as a JSON array (nil as null), each element
// by elem.
func appendJSONArray[T any](b []byte, xs []T, elem func([]byte, T) []byte) []byte {
	if xs == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, x := range xs {
		if i > 0 {
			b = append(b, ',')
		}
		b = elem(b, x)
	}
	return append(b, ']')
}

// appendJSONTime writes t as time.Time's MarshalJSON does (RFC 3339 with
// nanoseconds), and fails where it fails.
func appendJSONTime(b []byte, t time.Time) ([]byte, error) {
	n0 := len(b)
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	// MarshalJSON refuses what RFC 3339 cannot say: a year that is not
	// four digits, a zone offset of 24 hours or more.
	bad := b[n0+1+len("9999")] != '-'
	if !bad && b[len(b)-1] != 'Z' {
		c := b[len(b)-len("Z07:00")]
		bad = '0' <= c && c <= '9' || 10*(b[len(b)-5]-'0')+(b[len(b)-4]-'0') >= 24
	}
	if bad {
		_, err := t.MarshalJSON()
		if err == nil {
			err = errors.New("time outside of RFC 3339")
		}
		return b[:n0], fmt.Errorf("encode time %s: %w", t, err)
	}
	return append(b, '"'), nil
}

// appendJSONFloat writes f as encoding/json writes a float64: like %g, but
// with ES6's exponent cutoffs and exponents not padded to two digits.
func appendJSONFloat(b []byte, f float64) ([]byte, error) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return b, fmt.Errorf("encode float: unsupported value %v", f)
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, nil
}

const hexDigits = "0123456789abcdef"

// appendJSONString writes s quoted as encoding/json does with its default
// HTML escaping: <, > and & as \u003c, \u003e, \u0026, invalid UTF-8 as
// \ufffd, U+2028 and U+2029 escaped.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
