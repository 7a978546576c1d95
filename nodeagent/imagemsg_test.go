package nodeagent

import (
	"strings"
	"testing"
)

// TestPreparingImageNeverSaysPullingForLocalImages: the part's message
// while its image is made ready says "pulling" only for images that may
// be pulled; voyager.local ones, in any letters, are imported.
func TestPreparingImageNeverSaysPullingForLocalImages(t *testing.T) {
	for _, tc := range []struct {
		image, reason string
		pulls         bool
	}{
		{"voyager.local/jupyter:latest", "PreparingImage", false},
		{"VOYAGER.LOCAL/busybox:e2e", "PreparingImage", false},
		{"docker.io/library/python:3.12", "Pulling", true},
		{"voyager.local.example.com/x:1", "Pulling", true},
	} {
		reason, msg := preparingImage(tc.image)
		if reason != tc.reason || strings.Contains(msg, "pulling") != tc.pulls || !strings.Contains(msg, tc.image) {
			t.Errorf("preparingImage(%s) = %s %q; want reason %s, pulling said: %v", tc.image, reason, msg, tc.reason, tc.pulls)
		}
	}
}
