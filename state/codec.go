package state

import (
	"crypto/rand"
	stdjson "encoding/json"
	"fmt"
	"time"

	json "github.com/goccy/go-json"
)

// Encode returns v as compact JSON, the form every value is stored in.
func Encode(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("encode %T: %w", v, err)
	}
	return string(b), nil
}

// Decode parses a stored value. Unknown fields are ignored so that an older
// reader keeps working with values written by a newer writer.
func Decode[T any](b []byte) (T, error) {
	var v T
	if err := decodeInto(b, &v); err != nil {
		return v, fmt.Errorf("decode %T: %w", v, err)
	}
	return v, nil
}

// decodeInto parses b into the value v points to, with encoding/json.
// Values are written with goccy/go-json (Encode, appendJSON: a ledger
// about 2x faster, the same bytes, TestCodecIsEncodingJSON), but not read
// with it, though it reads about 4x faster: its strings point into its
// copy of the whole input, so a decoded 1-KB queue entry kept 2,238 bytes
// alive against 1,292 (26 November), and caches hold 100,000 of them at a
// large site (TestDecodeKeepsNotItsInput). The placer's ledger cache,
// which decodes every bind and holds one ledger per node, reads with it
// and copies what it keeps (placer/decode.go).
func decodeInto(b []byte, v any) error { return stdjson.Unmarshal(b, v) }

// crockford is Crockford's base32 alphabet in lower case: no i, l, o, u,
// so ids read aloud and typed by hand survive.
const crockford = "0123456789abcdefghjkmnpqrstvwxyz"

// NewSessionID returns a new session id: "s" followed by 10 characters of
// millisecond time and 8 random ones, 19 in all. Ids sort by creation time,
// which keeps `etcdctl get --prefix` output in submission order.
func NewSessionID(now time.Time) (string, error) {
	var rnd [5]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return "", fmt.Errorf("read random bytes: %w", err)
	}
	ms := uint64(now.UnixMilli())
	var b [19]byte
	b[0] = 's'
	for i := 10; i >= 1; i-- {
		b[i] = crockford[ms&31]
		ms >>= 5
	}
	r := uint64(rnd[0])<<32 | uint64(rnd[1])<<24 | uint64(rnd[2])<<16 | uint64(rnd[3])<<8 | uint64(rnd[4])
	for i := 18; i >= 11; i-- {
		b[i] = crockford[r&31]
		r >>= 5
	}
	return string(b[:]), nil
}
