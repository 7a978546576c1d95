package state

import (
	"fmt"
	"net/url"
	"strings"
)

// The node agent's streaming routes that the API relays to (nodeagent
// serves them: ExecPath and ForwardPath there). Both are WebSockets
// framed by internal/wsstream, opened by the key of the container's log
// URL.
const (
	// AgentExecPath + <container id>?exp=E&key=K&cmd=…&tty=…&stdin=…
	// runs a command in a session's running container.
	AgentExecPath = "/agent/v1/exec/"
	// AgentForwardPath + <container id>?exp=E&key=K&port=P connects to
	// port P on the container's own loopback.
	AgentForwardPath = "/agent/v1/forward/"
)

// AgentStreamURL is the URL of route (AgentExecPath or AgentForwardPath)
// for the container whose log URL is logs: the same agent and container,
// opened by the same expiry and key, with query added to them. Its scheme
// is ws or wss, as the log URL's is http or https.
func AgentStreamURL(logs, route string, query url.Values) (*url.URL, error) {
	u, err := url.Parse(logs)
	if err != nil || !strings.HasPrefix(u.Path, AgentLogsPath) || u.Host == "" {
		return nil, fmt.Errorf("derive agent stream URL: %q is not an agent's log URL", logs)
	}
	switch u.Scheme {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	default:
		return nil, fmt.Errorf("derive agent stream URL: %q is not an http or https URL", logs)
	}
	u.Path = route + strings.TrimPrefix(u.Path, AgentLogsPath)
	u.RawPath = ""
	q := u.Query()
	for k, vs := range query {
		if k == "exp" || k == "key" {
			continue
		}
		q[k] = vs
	}
	u.RawQuery = q.Encode()
	return u, nil
}
