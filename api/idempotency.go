package api

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/voyager-gpu/voyager/state"
)

// IdempotencyKeyHeader makes a create (of a session or of an array) safe
// to retry.
const IdempotencyKeyHeader = "Idempotency-Key"

// maxIdempotencyKey bounds an Idempotency-Key header.
const maxIdempotencyKey = 255

// idempotent reads a create's Idempotency-Key header and, when there is
// one, keeps the raw body (and puts it back for decodeBody) and returns
// the record the create writes with what it makes: at
// idempotency/<owner>/<digest of the key>, its RequestHash the body's
// digest, its id (Session or Array) for the caller to set. It returns nil
// without a header, and false after answering a problem.
func (a *API) idempotent(c *gin.Context, now time.Time) (*state.Idempotency, bool) {
	key := c.GetHeader(IdempotencyKeyHeader)
	if key == "" {
		return nil, true
	}
	if len(key) > maxIdempotencyKey {
		a.invalid(c, "Invalid request", []FieldError{{Field: "header " + IdempotencyKeyHeader, Message: fmt.Sprintf("want at most %d characters, e.g. a UUID", maxIdempotencyKey)}})
		return nil, false
	}
	body, err := io.ReadAll(c.Request.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			a.problem(c, http.StatusRequestEntityTooLarge, "Request too large", fmt.Sprintf("the body is larger than %d bytes", mbe.Limit))
			return nil, false
		}
		a.problem(c, http.StatusBadRequest, "Malformed body", "read body: "+err.Error())
		return nil, false
	}
	c.Request.Body = io.NopCloser(bytes.NewReader(body))
	digest := sha256.Sum256([]byte(key))
	bodyHash := sha256.Sum256(body)
	return &state.Idempotency{
		Key:    a.keys.Idempotency(principalOf(c).Subject, hex.EncodeToString(digest[:16])),
		Record: state.IdempotencyRecord{RequestHash: hex.EncodeToString(bodyHash[:16]), Created: now},
	}, true
}

// withLease gives idem the lease its record is written under
// (IdempotencyTTL).
func (a *API) withLease(c *gin.Context, idem *state.Idempotency) bool {
	lease, err := a.idempotencyLease(c.Request.Context())
	if err != nil {
		a.internal(c, "grant idempotency lease", err)
		return false
	}
	idem.Lease = lease
	return true
}

// replayed answers, before admission, a create whose Idempotency-Key is
// already recorded, with replay (the route's answer to a repeat: rec is
// this request's record, stored the one found), and reports whether it
// answered. Admission could refuse a repeat for what the first create did
// (the queue it filled), so a repeat never reaches it; this read is only
// a shortcut, and the create's transaction decides a race between two
// first requests. It returns false without a key (idem nil).
func (a *API) replayed(c *gin.Context, idem *state.Idempotency, replay func(c *gin.Context, rec, stored state.IdempotencyRecord)) bool {
	if idem == nil {
		return false
	}
	stored, _, err := state.Get[state.IdempotencyRecord](c.Request.Context(), a.cli, idem.Key)
	switch {
	case err == nil:
		replay(c, idem.Record, stored)
		return true
	case !errors.Is(err, state.ErrNotFound):
		a.internal(c, "read idempotency record", err)
		return true
	}
	return false
}

// replay answers a create whose Idempotency-Key stored is already at
// (rec is this request's record) for a route that makes a what (session
// or array), whose id in a record is id: with what the first request made
// (respond, after read found it) when the body digest is the same; 422
// when the key made something else (keyReused); 409 when what it made is
// gone (retired after it finished).
func (a *API) replay(c *gin.Context, rec, stored state.IdempotencyRecord, what, id string, read func() (bool, error), respond func()) {
	if id == "" || stored.RequestHash != rec.RequestHash {
		a.keyReused(c, stored, id == "")
		return
	}
	found, err := read()
	if err != nil {
		a.internal(c, "read "+what, err)
		return
	}
	if !found {
		a.problem(c, http.StatusConflict, "Conflict", fmt.Sprintf("%s %q created %s %s, which no longer exists (retired after it finished)", IdempotencyKeyHeader, c.GetHeader(IdempotencyKeyHeader), what, id))
		return
	}
	respond()
}

// keyReused answers a create whose Idempotency-Key already made something
// else: another body, or the other kind of object (a session's key sent
// with an array, or the reverse).
func (a *API) keyReused(c *gin.Context, stored state.IdempotencyRecord, kindMismatch bool) {
	made := "session " + stored.Session
	if stored.Array != "" {
		made = "array " + stored.Array
	}
	why := "with a different request body"
	if kindMismatch {
		why = "through the other route (POST /api/v1/sessions makes sessions, POST /api/v1/arrays arrays)"
	}
	a.problem(c, http.StatusUnprocessableEntity, "Idempotency key reused",
		fmt.Sprintf("%s %q already created %s %s; send a new key for a new request", IdempotencyKeyHeader, c.GetHeader(IdempotencyKeyHeader), made, why),
		FieldError{Field: "header " + IdempotencyKeyHeader, Message: "already used for a different request"})
}
