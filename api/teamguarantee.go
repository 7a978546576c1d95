package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/voyager-gpu/voyager/state"
)

// A team's guarantee is {"gpus": N, "models": {"MODEL": N, …}}: N GPUs
// in all, of which the models name part (state.TeamGuarantee). Shapes an
// admin might write instead — the models alone ({"H100": 8, "A100": 4}),
// a bare number, a count as a string or a fraction — would otherwise be
// refused by the body decoder as a malformed body naming one field, or
// (a bare model map under "models" with no "gpus") by the tree check as
// a sum beyond 0. decodeTeam refuses them first with a 422 that says
// what was sent and what to send, the models alone with the guarantee
// they most likely mean.

// guaranteeExample is the shape every message shows.
const guaranteeExample = `{"gpus": 12, "models": {"H100": 8}} (12 GPUs, 8 of them H100s)`

// decodeTeam decodes a team definition for team name from the body,
// answering the problem and returning false when it is not one. The
// guarantee's shape is checked first (guaranteeShape); the rest is
// decodeBody's.
func (a *API) decodeTeam(c *gin.Context, name string, t *state.Team) bool {
	body, err := io.ReadAll(c.Request.Body)
	if err != nil {
		// decodeBody answers it (a body over the limit: 413).
		c.Request.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{err}))
		return a.decodeBody(c, t)
	}
	if errs := guaranteeShape(name, body); len(errs) > 0 {
		a.invalid(c, "Invalid team", errs)
		return false
	}
	c.Request.Body = io.NopCloser(bytes.NewReader(body))
	return a.decodeBody(c, t)
}

// errReader fails every read with err.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// guaranteeShape checks the guarantee of a team definition's JSON body:
// an object of "gpus" and "models" only, a whole number of GPUs, models an
// object of whole numbers. Values out of range (negative, models beyond
// gpus) are the tree check's (state.ValidateTeams), with the same 422.
// A body that is not a JSON object is decodeBody's to refuse.
func guaranteeShape(team string, body []byte) []FieldError {
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return nil
	}
	raw, ok := top["guarantee"]
	if !ok || string(bytes.TrimSpace(raw)) == "null" {
		return nil
	}
	field := "teams." + team + ".guarantee"
	var g map[string]json.RawMessage
	if !isObject(raw) || json.Unmarshal(raw, &g) != nil {
		return []FieldError{{Field: field, Message: fmt.Sprintf("got %s, want an object such as %s", clip(raw), guaranteeExample)}}
	}
	var errs []FieldError
	var unknown []string
	for k := range g {
		if k != "gpus" && k != "models" {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	if len(unknown) > 0 {
		msg := fmt.Sprintf("unknown field %s; a guarantee is {\"gpus\": N, \"models\": {\"MODEL\": N}}, such as %s", quoteList(unknown), guaranteeExample)
		if models, sum, ok := modelsAlone(g); ok {
			b, _ := json.Marshal(map[string]any{"gpus": sum, "models": models})
			msg += fmt.Sprintf("; for these GPUs by model, send %s (add to gpus the GPUs of any model)", b)
		}
		errs = append(errs, FieldError{Field: field, Message: msg})
	}
	if v, ok := g["gpus"]; ok {
		if _, ok := wholeNumber(v); !ok {
			errs = append(errs, FieldError{Field: field + ".gpus", Message: fmt.Sprintf("got %s, want a whole number of GPUs, 0 or more", clip(v))})
		}
	}
	if v, ok := g["models"]; ok && string(bytes.TrimSpace(v)) != "null" {
		var m map[string]json.RawMessage
		if !isObject(v) || json.Unmarshal(v, &m) != nil {
			errs = append(errs, FieldError{Field: field + ".models", Message: fmt.Sprintf("got %s, want an object of GPU model to a whole number of GPUs, such as {\"H100\": 8, \"A100\": 4}", clip(v))})
		} else {
			keys := make([]string, 0, len(m))
			for k := range m {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				if _, ok := wholeNumber(m[k]); !ok {
					errs = append(errs, FieldError{Field: field + ".models." + k, Message: fmt.Sprintf("got %s, want a whole number of %s GPUs, 0 or more", clip(m[k]), k)})
				}
			}
			if _, hasGPUs := g["gpus"]; !hasGPUs && len(keys) > 0 {
				sum := 0
				for _, k := range keys {
					n, _ := wholeNumber(m[k])
					sum += max(n, 0)
				}
				errs = append(errs, FieldError{Field: field + ".gpus", Message: fmt.Sprintf("missing: models name part of gpus, which is the guarantee in all; send \"gpus\": %d or more with these models", sum)})
			}
		}
	}
	return errs
}

// modelsAlone reports whether every field of g is a whole number, as in
// a guarantee written as its models alone, with them and their sum.
func modelsAlone(g map[string]json.RawMessage) (map[string]int, int, bool) {
	if _, ok := g["gpus"]; ok {
		return nil, 0, false
	}
	if _, ok := g["models"]; ok {
		return nil, 0, false
	}
	out, sum := map[string]int{}, 0
	for k, v := range g {
		n, ok := wholeNumber(v)
		if !ok || n < 0 {
			return nil, 0, false
		}
		out[k] = n
		sum += n
	}
	return out, sum, true
}

// wholeNumber is v as a JSON integer (a number with no fraction or
// exponent that fits an int).
func wholeNumber(v json.RawMessage) (int, bool) {
	n, err := strconv.Atoi(string(bytes.TrimSpace(v)))
	return n, err == nil
}

// clip is a JSON value for a message: at most 40 characters.
func clip(v json.RawMessage) string {
	s := string(bytes.TrimSpace(v))
	if len(s) > 40 {
		s = s[:37] + "..."
	}
	return s
}

func quoteList(xs []string) string {
	q := make([]string, len(xs))
	for i, x := range xs {
		q[i] = strconv.Quote(x)
	}
	return strings.Join(q, ", ")
}

// isObject reports whether v is a JSON object.
func isObject(v json.RawMessage) bool {
	t := bytes.TrimSpace(v)
	return len(t) > 0 && t[0] == '{'
}
