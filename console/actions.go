package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// do performs one form's action through the API as the viewer and answers
// a notice (2xx) or the API's refusal with its status. Forms reach it only
// through the script, which adds the viewer's Authorization header: a
// cross-site form has no token, so it cannot act for anyone.
func (c *Console) do(ctx *gin.Context) {
	k := c.caller(ctx)
	if err := ctx.Request.ParseForm(); err != nil {
		c.fail(ctx, k, &apiError{Status: http.StatusBadRequest, Title: "Bad request", Detail: "read form: " + err.Error()})
		return
	}
	f := ctx.Request.PostForm
	parts := strings.Split(strings.Trim(ctx.Param("action"), "/"), "/")
	var (
		msg string
		err error
	)
	switch {
	case len(parts) == 1 && parts[0] == "sessions":
		msg, err = startSession(k, f.Get)
	case len(parts) == 3 && parts[0] == "sessions" && parts[2] == "stop":
		var r api.StopResult
		if err = k.call("POST", "/api/v1/sessions/"+q(parts[1])+"/stop", nil, &r); err == nil {
			msg = fmt.Sprintf("Session %s: %s.", parts[1], r.Outcome)
		}
	case len(parts) == 3 && parts[0] == "sessions" && parts[2] == "extend":
		var r api.SessionView
		if err = k.call("POST", "/api/v1/sessions/"+q(parts[1])+"/extend", map[string]string{"by": f.Get("by")}, &r); err == nil {
			msg = fmt.Sprintf("Session %s extended by %s.", parts[1], f.Get("by"))
			if r.RunsUntil != nil {
				msg = fmt.Sprintf("Session %s extended by %s: it may run until %s.", parts[1], f.Get("by"), r.RunsUntil.UTC().Format("2006-01-02 15:04 UTC"))
			}
		}
	case len(parts) == 3 && parts[0] == "nodes" && (parts[2] == "cordon" || parts[2] == "drain" || parts[2] == "uncordon"):
		msg, err = nodeAction(k, parts[1], parts[2], f.Get)
	case len(parts) == 1 && parts[0] == "quotas":
		msg, err = putQuota(k, f.Get)
	case len(parts) == 4 && parts[0] == "quotas" && parts[3] == "delete":
		if err = k.call("DELETE", "/api/v1/quotas/"+q(parts[1])+"/"+q(parts[2]), nil, nil); err == nil {
			msg = fmt.Sprintf("Quota of %s %s removed.", parts[1], parts[2])
		}
	case len(parts) == 1 && parts[0] == "profiles":
		msg, err = putProfile(k, f.Get)
	case len(parts) == 3 && parts[0] == "profiles" && parts[2] == "delete":
		if err = k.call("DELETE", "/api/v1/profiles/"+q(parts[1]), nil, nil); err == nil {
			msg = fmt.Sprintf("Profile %s removed.", parts[1])
		}
	default:
		err = &apiError{Status: http.StatusNotFound, Title: "Not found", Detail: fmt.Sprintf("no console action %q", ctx.Param("action"))}
	}
	if err != nil {
		c.fail(ctx, k, err)
		return
	}
	ctx.Header("X-Voyager-API-Calls", fmt.Sprint(k.calls))
	c.render(ctx, http.StatusOK, "notice", msg)
}

// badField is a form value the console cannot turn into a request.
func badField(field, msg string) error {
	return &apiError{Status: http.StatusUnprocessableEntity, Title: "Invalid request", Detail: field + ": " + msg}
}

// startSession turns the start form into POST /api/v1/sessions. A batch
// command is run by sh -c, so it may use the shell's quoting.
func startSession(k *caller, get func(string) string) (string, error) {
	req := api.SessionRequest{Kind: state.SessionKind(get("kind")), Profile: get("profile"), Image: strings.TrimSpace(get("image")), Name: strings.TrimSpace(get("name"))}
	if cmd := strings.TrimSpace(get("command")); cmd != "" {
		req.Command = []string{"sh", "-c", cmd}
	}
	var res state.Resources
	set := false
	if g := strings.TrimSpace(get("gpus")); g != "" {
		n, err := strconv.Atoi(g)
		if err != nil {
			return "", badField("gpus", fmt.Sprintf("got %q, want a whole number such as 1", g))
		}
		res.GPUs, set = n, true
	}
	if m := get("gpuModel"); m != "" {
		res.GPUModel, set = m, true
	}
	dev, err := applyDevice(&res, get)
	if err != nil {
		return "", err
	}
	if set = set || dev; set {
		req.Resources = &res
	}
	if d := strings.TrimSpace(get("maxRuntime")); d != "" {
		var lim state.Limits
		if err := json.Unmarshal([]byte(strconv.Quote(d)), &lim.MaxRuntime); err != nil {
			return "", badField("maxRuntime", fmt.Sprintf("got %q, want a duration such as 2h or 30m", d))
		}
		req.Limits = &lim
	}
	var v api.SessionView
	if err := k.call("POST", "/api/v1/sessions", req, &v); err != nil {
		return "", err
	}
	return fmt.Sprintf("Started %s session %s: %s.", v.Kind, v.ID, v.Status.Phase), nil
}

func nodeAction(k *caller, node, verb string, get func(string) string) (string, error) {
	var body any
	if verb != "uncordon" {
		b := map[string]any{}
		if r := strings.TrimSpace(get("reason")); r != "" {
			b["reason"] = r
		}
		if d := strings.TrimSpace(get("deadline")); d != "" && verb == "drain" {
			b["deadline"] = d
		}
		body = b
	}
	if err := k.call("POST", "/api/v1/nodes/"+q(node)+"/"+verb, body, nil); err != nil {
		return "", err
	}
	return fmt.Sprintf("Node %s: %s done.", node, verb), nil
}

func putQuota(k *caller, get func(string) string) (string, error) {
	scope, name := get("scope"), strings.TrimSpace(get("name"))
	var qt state.Quota
	for _, f := range []struct {
		field string
		dst   **int64
	}{{"gpus", &qt.GPUs}, {"cpuMilli", &qt.CPUMilli}, {"memoryMiB", &qt.MemoryMiB}} {
		s := strings.TrimSpace(get(f.field))
		if s == "" {
			continue
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return "", badField(f.field, fmt.Sprintf("got %q, want a whole number, or nothing for unlimited", s))
		}
		*f.dst = &n
	}
	if err := k.call("PUT", "/api/v1/quotas/"+q(scope)+"/"+q(name), qt, nil); err != nil {
		return "", err
	}
	return fmt.Sprintf("Quota of %s %s saved.", scope, name), nil
}

func putProfile(k *caller, get func(string) string) (string, error) {
	name := strings.TrimSpace(get("name"))
	// The API decodes the text itself, so it names unknown fields.
	raw := json.RawMessage(strings.TrimSpace(get("profile")))
	if !json.Valid(raw) {
		return "", badField("profile", `want a JSON object such as {"kind":"notebook","resources":{"gpus":1}}`)
	}
	if err := k.call("PUT", "/api/v1/profiles/"+q(name), raw, nil); err != nil {
		return "", err
	}
	return fmt.Sprintf("Profile %s saved.", name), nil
}

// profileJSON is p as the admin form edits it: without its name (the
// form's own field), characters as they are (the template escapes them).
func profileJSON(p state.Profile) string {
	var m map[string]any
	b, _ := json.Marshal(p)
	_ = json.Unmarshal(b, &m)
	delete(m, "name")
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	_ = enc.Encode(m)
	return strings.TrimSpace(buf.String())
}
