package runtime

import "testing"

func TestNormalizeRef(t *testing.T) {
	for in, want := range map[string]string{
		"voyager/jupyter:latest":       "docker.io/voyager/jupyter:latest",
		"busybox":                      "docker.io/library/busybox:latest",
		"voyager.local/busybox:latest": "voyager.local/busybox:latest",
		"Not A Ref":                    "Not A Ref",
	} {
		if got := normalizeRef(in); got != want {
			t.Errorf("normalizeRef(%q) = %q, want %q", in, got, want)
		}
	}
}
