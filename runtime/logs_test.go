package runtime_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/runtime"
)

func TestTail(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content string
		n             int
		want          []string
	}{
		{"absent", "", 3, nil},
		{"empty", "-", 3, nil},
		{"fewer lines", "a\nb\n", 5, []string{"a", "b"}},
		{"last n", "a\nb\nc\nd\n", 2, []string{"c", "d"}},
		{"no final newline", "a\nb", 1, []string{"b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name)
			if tc.content != "" {
				os.WriteFile(p, []byte(strings.TrimPrefix(tc.content, "-")), 0o600)
			}
			got, err := runtime.Tail(p, tc.n)
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("Tail = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestTrimLogKeepsTheTailUnderTheCap(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	var b strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&b, "line %04d\n", i)
	}
	os.WriteFile(p, []byte(b.String()), 0o600)
	trimmed, err := runtime.TrimLog(p, 2000)
	if err != nil || !trimmed {
		t.Fatalf("TrimLog = %v, %v; want true, nil", trimmed, err)
	}
	got, _ := os.ReadFile(p)
	if len(got) > 2000 || !strings.HasPrefix(string(got), "[voyager: earlier output trimmed]\nline ") || !strings.HasSuffix(string(got), "line 0999\n") {
		t.Fatalf("after trim (%d bytes): %q", len(got), got)
	}
	if again, _ := runtime.TrimLog(p, 2000); again {
		t.Fatal("a log under the cap was trimmed again")
	}
}
