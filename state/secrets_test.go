package state_test

import (
	"maps"
	"testing"

	"github.com/voyager-gpu/voyager/state"
)

func TestSplitSecrets(t *testing.T) {
	cases := []struct {
		name         string
		urls         map[string]string
		public, full map[string]string
	}{
		{name: "none", urls: nil, public: nil, full: nil},
		{name: "no secret", urls: map[string]string{"jupyter": "http://gpu-1:40001/"},
			public: map[string]string{"jupyter": "http://gpu-1:40001/"}, full: nil},
		{name: "token and key",
			urls:   map[string]string{"jupyter": "http://gpu-1:40001/?token=t0k", "logs": "https://gpu-1:7071/agent/v1/logs/s-q1?key=abc", "ray": "http://gpu-1:8265/"},
			public: map[string]string{"jupyter": "http://gpu-1:40001/", "logs": "https://gpu-1:7071/agent/v1/logs/s-q1", "ray": "http://gpu-1:8265/"},
			full:   map[string]string{"jupyter": "http://gpu-1:40001/?token=t0k", "logs": "https://gpu-1:7071/agent/v1/logs/s-q1?key=abc"}},
		{name: "other parameters stay", urls: map[string]string{"jupyter": "http://gpu-1:40001/lab?token=t&x=1"},
			public: map[string]string{"jupyter": "http://gpu-1:40001/lab?x=1"}, full: map[string]string{"jupyter": "http://gpu-1:40001/lab?token=t&x=1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := state.Status{Session: "s1", URLs: maps.Clone(c.urls)}
			pub, full := state.SplitSecrets(in)
			if !maps.Equal(pub.URLs, c.public) || !maps.Equal(full, c.full) {
				t.Fatalf("SplitSecrets(%v) = %v, %v; want %v, %v", c.urls, pub.URLs, full, c.public, c.full)
			}
			if !maps.Equal(in.URLs, c.urls) {
				t.Errorf("the input's URLs changed to %v", in.URLs)
			}
			joined := state.JoinSecrets(pub.URLs, state.Secrets{URLs: full})
			if !maps.Equal(joined, c.urls) && len(c.urls) > 0 {
				t.Errorf("JoinSecrets gives %v, want the original %v", joined, c.urls)
			}
		})
	}
}
