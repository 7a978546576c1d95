package state

import (
	"net/url"
	"slices"
)

// secretParams are the query parameters of status URLs that grant access:
// Jupyter's token, the agent's log-URL key.
var secretParams = []string{"token", "key"}

// SplitSecrets returns st with the secret query parameters removed from
// its URLs, and the full URLs that had any (nil if none did). The agent
// writes the first to status/<id>, which operators read, and the second to
// secrets/<node>/<id>, which only the API and that agent read; the API
// joins them back for the session's owner (JoinSecrets).
func SplitSecrets(st Status) (Status, map[string]string) {
	var secret map[string]string
	var public map[string]string
	for name, raw := range st.URLs {
		u, err := url.Parse(raw)
		if err != nil {
			continue
		}
		q := u.Query()
		found := false
		for _, p := range secretParams {
			if q.Has(p) {
				q.Del(p)
				found = true
			}
		}
		if !found {
			continue
		}
		if secret == nil {
			secret = map[string]string{}
			public = make(map[string]string, len(st.URLs))
			for k, v := range st.URLs {
				public[k] = v
			}
		}
		secret[name] = raw
		u.RawQuery = q.Encode()
		public[name] = u.String()
	}
	if secret != nil {
		st.URLs = public
	}
	return st, secret
}

// JoinSecrets returns urls with each URL that sec holds in full replaced
// by the full one, for the session's owner. Neither input is changed.
func JoinSecrets(urls map[string]string, sec Secrets) map[string]string {
	if len(sec.URLs) == 0 {
		return urls
	}
	out := make(map[string]string, len(urls))
	for k, v := range urls {
		if full, ok := sec.URLs[k]; ok {
			v = full
		}
		out[k] = v
	}
	return out
}

// HasSecretParams reports whether raw carries a secret query parameter.
func HasSecretParams(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	q := u.Query()
	return slices.ContainsFunc(secretParams, q.Has)
}
