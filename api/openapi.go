package api

import (
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/voyager-gpu/voyager/state"
)

// operation documents one route for the OpenAPI document.
type operation struct {
	method, path, summary string
	access                string // "user", "user or service", "admin", "none"
	request               any    // body type, nil for none
	response              any    // 2xx body type, nil for none
	status                int    // success status
	params                []param
	produces              string // success media type; default application/json
}

type param struct {
	in, name, desc string
}

var idParam = param{"path", "id", "session id"}

// dashPathParam and dashboardSummary describe the Ray dashboard proxy.
var dashPathParam = param{"path", "path", "the dashboard's own path and query (its pages, /api/jobs/ of Ray's Jobs API)"}

const dashboardSummary = "The session's Ray dashboard (its pages and Ray's Jobs API), proxied through the agent of its head, which reaches it inside the head's container: it is published nowhere. The owner only (not admins: it runs code as the session); the caller's Authorization and Cookie headers are not passed on; responses carry a sandboxing Content-Security-Policy. 404 without a Ray cluster, 503 while the head is not running. `voyager dashboard` serves it on a local port for a browser."

// operations lists every route; TestOpenAPICoversEveryRoute keeps it equal
// to the router.
var operations = []operation{
	{method: "GET", path: "/openapi.json", summary: "This document.", access: "none", status: 200},
	{method: "GET", path: "/api/v1/openapi.json", summary: "This document.", access: "user", status: 200},
	{method: "GET", path: "/api/v1/whoami", summary: "Who the token says you are.", access: "user or service", response: Whoami{}, status: 200},
	{method: "POST", path: "/api/v1/sessions", summary: "Create a session. Repeats with the same Idempotency-Key header (per user, for VOYAGER_API_IDEMPOTENCY_TTL) return the first session with Idempotent-Replayed: true. A request for a GPU model no node has, or larger than any node could ever hold, is refused with 422; with no nodes registered at all it is accepted and queues.", access: "user or service", request: SessionRequest{}, response: SessionView{}, status: 201,
		params: []param{{"header", "Idempotency-Key", "makes the create safe to retry (at most 255 characters)"}}},
	{method: "GET", path: "/api/v1/sessions", summary: "List sessions, newest last: yours, or anyone's for admins.", access: "user or service", response: SessionList{}, status: 200,
		params: []param{{"query", "phase", "only sessions in this phase"}, {"query", "owner", "only this owner's (admins)"}, {"query", "limit", "page size, 1-500 (default 50)"}, {"query", "continue", "the continue token of the previous page"}}},
	{method: "GET", path: "/api/v1/sessions/{id}", summary: "A session's spec and status, with its live queue position and reason while pending, its activity while it runs (Jupyter, GPUs), the system's warning if it will stop it, and runsUntil when a max runtime applies. The Jupyter URL carries its token for the owner only.", access: "user or service", response: SessionView{}, status: 200, params: []param{idParam}},
	{method: "POST", path: "/api/v1/sessions/{id}/stop", summary: "Stop a session: a pending one is cancelled at once (Stopped), a bound or running one is stopped by its agent.", access: "user or service", response: StopResult{}, status: 202, params: []param{idParam}},
	{method: "POST", path: "/api/v1/sessions/{id}/extend", summary: "Extend a live session's max runtime by the body's \"by\": the limit that applies (limits.maxRuntime, else the cluster default VOYAGER_MAX_RUNTIME) plus by, up to the cluster's cap VOYAGER_MAX_RUNTIME_CAP (422 naming the cap, the current limit and what may still be added). 409 for a session that has ended, is stopping, or has no max runtime. A MaxRuntime warning is withdrawn by the lifecycle controller when the new limit moves the stop beyond the warning window.", access: "user or service", request: ExtendRequest{}, response: SessionView{}, status: 200, params: []param{idParam}},
	{method: "DELETE", path: "/api/v1/sessions/{id}", summary: "Same as stop; the record is kept for history.", access: "user or service", response: StopResult{}, status: 202, params: []param{idParam}},
	{method: "GET", path: "/api/v1/sessions/{id}/events", summary: "Server-Sent Events in etcd revision order: event: status (data: Event) for every change of phase, reason or message, starting with the current status and ending after a terminal phase; event: warning (data: WarningEvent) when the system warns it will stop the session (idle, max runtime, drain, preemption) or changes that warning; event: warning-withdrawn (data: WarningEvent) when a warning's cause goes away while the session runs. Resumes after Last-Event-ID.", access: "user or service", response: Event{}, status: 200, produces: "text/event-stream",
		params: []param{idParam, {"header", "Last-Event-ID", "resume after this event id"}}},
	{method: "GET", path: "/api/v1/sessions/{id}/logs", summary: "The container's output, proxied from the node agent that runs it (text/plain). 503 until an agent publishes the session's log endpoint. A multi-node job's is every part's, read from each part's agent, each line prefixed \"[rank R] \" (a followed one: 503 until every part has published its log).", access: "user or service", status: 200, produces: "text/plain",
		params: []param{idParam, {"query", "tail", "only the last N lines (0: all)"}, {"query", "follow", "true: stream until the container exits"}, {"query", "rank", "a multi-node job's part: only its output, unprefixed"}}},
	{method: "GET", path: "/api/v1/sessions/{id}/ray/dashboard/{path}", summary: dashboardSummary, access: "user or service (the owner only)", status: 200, produces: "text/html", params: []param{idParam, dashPathParam}},
	{method: "POST", path: "/api/v1/sessions/{id}/ray/dashboard/{path}", summary: dashboardSummary, access: "user or service (the owner only)", status: 200, params: []param{idParam, dashPathParam}},
	{method: "PUT", path: "/api/v1/sessions/{id}/ray/dashboard/{path}", summary: dashboardSummary, access: "user or service (the owner only)", status: 200, params: []param{idParam, dashPathParam}},
	{method: "DELETE", path: "/api/v1/sessions/{id}/ray/dashboard/{path}", summary: dashboardSummary, access: "user or service (the owner only)", status: 200, params: []param{idParam, dashPathParam}},
	{method: "POST", path: "/api/v1/arrays", summary: "Create a job array (a sweep): one batch session per index of indices (\"0-99\", \"0-99:10\", \"1,5,7-9\") or per value of params, made from the session fields with {index} and {param} replaced in the command and environment values and VOYAGER_ARRAY_ID, VOYAGER_ARRAY_INDEX, VOYAGER_ARRAY_SIZE (and VOYAGER_ARRAY_PARAM) set. At most maxRunning elements are unfinished at once (0: no cap); the system creates them as others end. Every element is checked at admission; the array is written in one transaction and its elements by the array controller, so a refused request writes nothing. It counts min(maxRunning, size) against VOYAGER_API_MAX_QUEUED_PER_USER. The template may be a multi-node job (nodes above 1): each element is then a gang, and maxRunning counts elements. Repeats with the same Idempotency-Key header (per user, for VOYAGER_API_IDEMPOTENCY_TTL, one key space with sessions' creates) return the first array with Idempotent-Replayed: true; with another body, 422; once that array was retired, 409.", access: "user or service", request: ArrayRequest{}, response: ArrayView{}, status: 201,
		params: []param{{"header", "Idempotency-Key", "makes the create safe to retry (at most 255 characters)"}}},
	{method: "GET", path: "/api/v1/arrays", summary: "Job arrays with their summaries: yours, or everyone's for admins.", access: "user or service", response: ArrayList{}, status: 200},
	{method: "GET", path: "/api/v1/arrays/{id}", summary: "One job array: its summary (succeeded, failed, stopped, running, pending, waiting for the cap, skipped after a stop) and every created element's phase and exit code.", access: "user or service", response: ArrayView{}, status: 200, params: []param{{"path", "id", "array id"}}},
	{method: "POST", path: "/api/v1/arrays/{id}/stop", summary: "Stop a job array: no more elements are created, and every unfinished one is stopped (queued ones cancelled).", access: "user or service", response: ArrayStopResult{}, status: 202, params: []param{{"path", "id", "array id"}}},
	{method: "GET", path: "/api/v1/profiles", summary: "Session profiles.", access: "user or service", response: ProfileList{}, status: 200},
	{method: "GET", path: "/api/v1/profiles/{name}", summary: "One profile.", access: "user or service", response: state.Profile{}, status: 200, params: []param{{"path", "name", "profile name"}}},
	{method: "PUT", path: "/api/v1/profiles/{name}", summary: "Create or replace a profile. A profile every session made from which would be refused (env naming JUPYTER_TOKEN or a VOYAGER_ variable, an image from a registry not allowed, resources below the cluster's minimums…) is refused with 422 naming each field, and nothing is stored.", access: "admin", request: state.Profile{}, response: state.Profile{}, status: 200, params: []param{{"path", "name", "profile name"}}},
	{method: "DELETE", path: "/api/v1/profiles/{name}", summary: "Delete a profile.", access: "admin", status: 204, params: []param{{"path", "name", "profile name"}}},
	{method: "GET", path: "/api/v1/volumes", summary: "The volumes the caller may mount into sessions (every volume for admins).", access: "user or service", response: VolumeList{}, status: 200},
	{method: "GET", path: "/api/v1/volumes/{name}", summary: "One volume; 404 for one the caller may not mount.", access: "user or service", response: state.Volume{}, status: 200, params: []param{{"path", "name", "volume name"}}},
	{method: "PUT", path: "/api/v1/volumes/{name}", summary: "Define or replace a volume: a host path on every node (or a per-user path with {user}), read-only or not, for the users and groups it names (none: everyone). Sessions that already mount it keep the definition they were admitted with.", access: "admin", request: state.Volume{}, response: state.Volume{}, status: 200, params: []param{{"path", "name", "volume name"}}},
	{method: "DELETE", path: "/api/v1/volumes/{name}", summary: "Delete a volume's definition (its files stay on the nodes).", access: "admin", status: 204, params: []param{{"path", "name", "volume name"}}},
	{method: "GET", path: "/api/v1/nodes", summary: "Live nodes with GPUs total, used, free and allocated-but-unused (with the sessions holding them; others' anonymous except for admins), and whether each is simulated or cordoned; with devices=true every device with its holder (anonymous as above) and sampled use.", access: "user", response: NodeList{}, status: 200,
		params: []param{{"query", "devices", "true: list each node's devices (the web console's cluster page)"}}},
	{method: "POST", path: "/api/v1/nodes/{name}/cordon", summary: "Cordon a node: no new sessions land on it. 404 for a node that is neither registered nor has a ledger (an agent that is down keeps its ledger).", access: "admin", request: CordonRequest{}, response: CordonResult{}, status: 200, params: []param{{"path", "name", "node name"}}},
	{method: "POST", path: "/api/v1/nodes/{name}/uncordon", summary: "Remove a node's cordon.", access: "admin", response: UncordonResult{}, status: 200, params: []param{{"path", "name", "node name"}}},
	{method: "POST", path: "/api/v1/nodes/{name}/drain", summary: "Cordon a node and drain it: the lifecycle controller warns its notebook sessions and stops them at the deadline (\"0s\": at once, after the warning; absent: VOYAGER_DRAIN_DEADLINE); batch sessions run to completion. The answer lists the notebooks that will stop.", access: "admin", request: CordonRequest{}, response: CordonResult{}, status: 200, params: []param{{"path", "name", "node name"}}},
	{method: "GET", path: "/api/v1/queue", summary: "The queue in the placer's order, with why each session waits, and for the caller's own an estimate of the earliest start from the max runtimes of the sessions holding the GPUs it needs. Others' sessions are anonymous except for admins.", access: "user", response: QueueView{}, status: 200},
	{method: "GET", path: "/api/v1/audit", summary: "The audit log of this API process (admins): one record per state-changing call (who, on behalf of whom, action, target, outcome, status, why it was refused), oldest first, the newest limit that match. Each API replica keeps its own log (VOYAGER_API_AUDIT_LOG); 404 when it keeps none.", access: "admin", response: AuditList{}, status: 200,
		params: []param{{"query", "since", "RFC 3339 time or a duration before now (24h)"}, {"query", "until", "RFC 3339 time or a duration before now"}, {"query", "actor", "a subject: the actor or the user a service acted for"}, {"query", "action", "an action (session.create), or a prefix ending in '.' (session.)"}, {"query", "target", "a session id, node, profile, volume or scope/name"}, {"query", "outcome", "ok, refused or failed"}, {"query", "limit", "1 to 10000 (default 1000)"}}},
	{method: "GET", path: "/api/v1/quotas", summary: "Every quota.", access: "admin", response: QuotaList{}, status: 200},
	{method: "PUT", path: "/api/v1/quotas/{scope}/{name}", summary: "Set a user's or group's quota (absent fields: unlimited).", access: "admin", request: state.Quota{}, response: state.Quota{}, status: 200,
		params: []param{{"path", "scope", "users or groups"}, {"path", "name", "user or group"}}},
	{method: "DELETE", path: "/api/v1/quotas/{scope}/{name}", summary: "Remove a quota.", access: "admin", status: 204,
		params: []param{{"path", "scope", "users or groups"}, {"path", "name", "user or group"}}},
}

var (
	openAPIOnce sync.Once
	openAPIDoc  map[string]any
)

func (a *API) openAPI(c *gin.Context) {
	openAPIOnce.Do(func() { openAPIDoc = buildOpenAPI() })
	c.JSON(http.StatusOK, openAPIDoc)
}

// buildOpenAPI writes the OpenAPI 3 document from operations, with
// schemas derived from the Go types by their JSON tags.
func buildOpenAPI() map[string]any {
	schemas := map[string]any{}
	paths := map[string]any{}
	problem := map[string]any{"description": "a problem document", "content": map[string]any{ProblemContentType: map[string]any{"schema": schemaRef(reflect.TypeOf(Problem{}), schemas)}}}
	for _, op := range operations {
		item, _ := paths[op.path].(map[string]any)
		if item == nil {
			item = map[string]any{}
			paths[op.path] = item
		}
		o := map[string]any{"summary": op.summary, "description": "Access: " + op.access + "."}
		if op.access == "none" {
			o["security"] = []any{}
		}
		var ps []any
		for _, p := range op.params {
			ps = append(ps, map[string]any{"in": p.in, "name": p.name, "description": p.desc, "required": p.in == "path", "schema": map[string]any{"type": "string"}})
		}
		if op.access == "user or service" {
			ps = append(ps, map[string]any{"in": "header", "name": OnBehalfOfHeader, "description": "the user a service token acts for", "required": false, "schema": map[string]any{"type": "string"}})
		}
		if len(ps) > 0 {
			o["parameters"] = ps
		}
		if op.request != nil {
			o["requestBody"] = map[string]any{"required": true, "content": map[string]any{"application/json": map[string]any{"schema": schemaRef(reflect.TypeOf(op.request), schemas)}}}
		}
		ok := map[string]any{"description": http.StatusText(op.status)}
		if op.response != nil || op.produces != "" {
			media := op.produces
			if media == "" {
				media = "application/json"
			}
			s := map[string]any{"type": "string"}
			if op.response != nil {
				s = schemaRef(reflect.TypeOf(op.response), schemas)
			}
			ok["content"] = map[string]any{media: map[string]any{"schema": s}}
		}
		responses := map[string]any{itoa(op.status): ok, "default": problem}
		o["responses"] = responses
		item[strings.ToLower(op.method)] = o
	}
	// The events route's other data type: an operation names one.
	schemaRef(reflect.TypeOf(WarningEvent{}), schemas)
	return map[string]any{
		"openapi": "3.0.3",
		"info": map[string]any{"title": "Voyager API", "version": "v1",
			"description": "GPU sessions for researchers. Every error is application/problem+json naming the field and what would be valid. Authenticate with a JWT bearer token."},
		"paths":      paths,
		"components": map[string]any{"schemas": schemas, "securitySchemes": map[string]any{"bearer": map[string]any{"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}}},
		"security":   []any{map[string]any{"bearer": []any{}}},
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

var (
	timeType     = reflect.TypeOf(time.Time{})
	durationType = reflect.TypeOf(state.Duration(0))
)

// schemaRef returns a schema for t, adding named structs to schemas.
func schemaRef(t reflect.Type, schemas map[string]any) map[string]any {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case t == durationType:
		return map[string]any{"type": "string", "description": "a Go duration such as 90m or 2h"}
	}
	switch t.Kind() {
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int64, reflect.Int32:
		return map[string]any{"type": "integer"}
	case reflect.Float64, reflect.Float32:
		return map[string]any{"type": "number"}
	case reflect.Slice:
		return map[string]any{"type": "array", "items": schemaRef(t.Elem(), schemas)}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": schemaRef(t.Elem(), schemas)}
	case reflect.Struct:
		name := t.Name()
		if _, done := schemas[name]; !done {
			schemas[name] = map[string]any{} // placeholder against recursion
			props := map[string]any{}
			addFields(t, props, schemas)
			schemas[name] = map[string]any{"type": "object", "properties": props}
		}
		return map[string]any{"$ref": "#/components/schemas/" + name}
	}
	return map[string]any{}
}

func addFields(t reflect.Type, props map[string]any, schemas map[string]any) {
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			addFields(f.Type, props, schemas)
			continue
		}
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		props[name] = schemaRef(f.Type, schemas)
	}
}
