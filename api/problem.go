package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"
)

// Problem is an RFC 9457 problem document, the body of every error.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	// Detail says what went wrong in plain words, and what would be valid.
	Detail string `json:"detail"`
	// Errors lists each invalid field of a refused request body.
	Errors []FieldError `json:"errors,omitempty"`
}

// FieldError is one invalid field: its JSON path and what would be valid.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// String writes the error as "field: message".
func (e FieldError) String() string { return e.Field + ": " + e.Message }

// ProblemContentType is the media type of error bodies.
const ProblemContentType = "application/problem+json"

func (a *API) problem(c *gin.Context, status int, title, detail string, fields ...FieldError) {
	p := Problem{Type: "about:blank", Title: title, Status: status, Detail: detail, Errors: fields}
	b, err := json.Marshal(p)
	if err != nil {
		b = []byte(`{"title":"Internal error","status":500}`)
	}
	c.Set(auditProblemKey, detail)
	c.Abort()
	c.Data(status, ProblemContentType, b)
}

// invalid answers 422 with every field error.
func (a *API) invalid(c *gin.Context, title string, fields []FieldError) {
	parts := make([]string, len(fields))
	for i, f := range fields {
		parts[i] = f.String()
	}
	a.problem(c, http.StatusUnprocessableEntity, title, strings.Join(parts, "; "), fields...)
}

// internal logs err and answers 500 (or 503 when etcd is unavailable).
func (a *API) internal(c *gin.Context, what string, err error) {
	if c.Request.Context().Err() != nil {
		c.Abort()
		return
	}
	a.log.Error(what, "err", err, "path", c.Request.URL.Path)
	a.problem(c, http.StatusServiceUnavailable, "Unavailable", what+": etcd did not answer; retry shortly")
}

// decodeBody reads a JSON body strictly into v: unknown fields, trailing
// data, wrong types and bodies over the cap are refused with a problem
// that names the field. It returns false after answering.
func (a *API) decodeBody(c *gin.Context, v any) bool {
	if ct := c.ContentType(); ct != "" && ct != "application/json" {
		a.problem(c, http.StatusUnsupportedMediaType, "Unsupported media type", fmt.Sprintf("Content-Type %q: want application/json", ct))
		return false
	}
	dec := json.NewDecoder(c.Request.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("trailing data after the JSON object")
		}
	}
	if err == nil {
		return true
	}
	var (
		mbe *http.MaxBytesError
		se  *json.SyntaxError
		te  *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &mbe):
		a.problem(c, http.StatusRequestEntityTooLarge, "Request too large", fmt.Sprintf("the body is larger than %d bytes", mbe.Limit))
	case errors.Is(err, io.EOF):
		a.problem(c, http.StatusBadRequest, "Malformed body", "the body is empty: want a JSON object")
	case errors.As(err, &se):
		a.problem(c, http.StatusBadRequest, "Malformed body", fmt.Sprintf("invalid JSON at byte %d: %v", se.Offset, se))
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			field = "(body)"
		}
		a.problem(c, http.StatusBadRequest, "Malformed body", fmt.Sprintf("%s: got a JSON %s, want %s", field, te.Value, jsonKind(te.Type.String())),
			FieldError{Field: field, Message: fmt.Sprintf("want %s", jsonKind(te.Type.String()))})
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		a.problem(c, http.StatusBadRequest, "Malformed body", fmt.Sprintf("unknown field %q; the fields are listed in /openapi.json", name),
			FieldError{Field: name, Message: "unknown field"})
	default:
		a.problem(c, http.StatusBadRequest, "Malformed body", err.Error())
	}
	return false
}

func jsonKind(goType string) string {
	switch {
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"), strings.HasPrefix(goType, "float"):
		return "a number"
	case goType == "string", strings.HasSuffix(goType, "Duration"), strings.HasSuffix(goType, "Kind"):
		return "a string"
	case goType == "bool":
		return "true or false"
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	case strings.HasPrefix(goType, "map["):
		return "an object"
	}
	return "an object"
}
