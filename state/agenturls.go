package state

import (
	"fmt"
	"net/url"
	"strings"
)

// The node agent's HTTP routes that the API proxies to (nodeagent serves
// them, LogsPath and DashboardPath there).
const (
	// AgentLogsPath + <container id>?exp=E&key=K serves a container's log.
	AgentLogsPath = "/agent/v1/logs/"
	// AgentDashboardPath + <container id>/<path>?exp=E&key=K proxies a
	// Ray head's dashboard.
	AgentDashboardPath = "/agent/v1/ray-dashboard/"
)

// DashboardURL is the base URL of the Ray dashboard of the head container
// whose log URL is logs: the same agent, under AgentDashboardPath, opened
// by the same expiry and key.
func DashboardURL(logs string) (*url.URL, error) {
	u, err := url.Parse(logs)
	if err != nil || !strings.HasPrefix(u.Path, AgentLogsPath) || u.Host == "" {
		return nil, fmt.Errorf("derive dashboard URL: %q is not an agent's log URL", logs)
	}
	u.Path = AgentDashboardPath + strings.TrimPrefix(u.Path, AgentLogsPath) + "/"
	u.RawPath = ""
	return u, nil
}
