package nodeagent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"
)

// TestReadGoodputRefusesHostileFiles: the report file is the tenant's. A
// good report is read; anything else is refused with an error saying what
// is wrong, without following a link, opening a device, blocking on a
// FIFO or reading past the bound.
func TestReadGoodputRefusesHostileFiles(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret.json")
	if err := os.WriteFile(secret, []byte(`{"size": 4, "samplesPerSecond": 99}`), 0o600); err != nil {
		t.Fatal(err)
	}
	good := `{"size": 4, "samplesPerSecond": 1234.5, "efficiency": 0.8}`
	write := func(s string) func(string) error {
		return func(p string) error { return os.WriteFile(p, []byte(s), 0o644) }
	}
	for _, tc := range []struct {
		name string
		make func(path string) error // nil: no file
		want string                  // "" read; else a part of the error
	}{
		{"no file", nil, "no goodput report"},
		{"good", write(good), ""},
		{"good, without efficiency", write(`{"size":4,"samplesPerSecond":10}`), ""},
		{"a symbolic link to a file the agent could read", func(p string) error { return os.Symlink(secret, p) }, "not a regular file"},
		{"a symbolic link to /etc/shadow", func(p string) error { return os.Symlink("/etc/shadow", p) }, "not a regular file"},
		{"a hard link", func(p string) error { return os.Link(secret, p) }, "2 links"},
		{"a FIFO", func(p string) error { return syscall.Mkfifo(p, 0o644) }, "not a regular file"},
		{"a device", func(p string) error { return syscall.Mknod(p, syscall.S_IFCHR|0o644, 1<<8|3) }, "not a regular file"}, // /dev/null's numbers
		{"a directory", func(p string) error { return os.Mkdir(p, 0o755) }, "not a regular file"},
		{"huge", write(good + strings.Repeat(" ", 1<<20)), "over 4096"},
		{"just over the bound", write(strings.Repeat(" ", goodputMaxBytes-len(good)+1) + good), "over 4096"},
		{"at the bound", write(strings.Repeat(" ", goodputMaxBytes-len(good)) + good), ""},
		{"an unknown field", write(`{"size":4,"samplesPerSecond":1,"owner":"root"}`), "unknown field"},
		{"two values", write(good + good), "more than one JSON value"},
		{"not JSON", write("\xff\xfe\x00garbage"), "want one JSON object"},
		{"a number out of range", write(`{"size":4,"samplesPerSecond":1e999}`), "want one JSON object"},
		{"a string for a number", write(`{"size":"4","samplesPerSecond":1}`), "want one JSON object"},
		{"another size", write(`{"size":8,"samplesPerSecond":1}`), "runs at 4 GPUs"},
		{"negative throughput", write(`{"size":4,"samplesPerSecond":-5}`), "samplesPerSecond"},
		{"efficiency above 1", write(`{"size":4,"samplesPerSecond":5,"efficiency":3}`), "efficiency"},
		{"empty", write(""), "want one JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.make != nil {
				if err := tc.make(filepath.Join(dir, "goodput.json")); err != nil {
					t.Fatal(err)
				}
			}
			done := make(chan struct{})
			var err error
			go func() {
				defer close(done)
				_, err = readGoodput(dir, 4)
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("readGoodput blocked")
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			case err != nil && (!utf8.ValidString(err.Error()) || len(err.Error()) > 600):
				t.Fatalf("error not clipped to valid text: %q", err)
			}
			if tc.make == nil && !errors.Is(err, errNoReport) {
				t.Fatalf("no file: %v, want errNoReport", err)
			}
		})
	}
	r, err := readGoodput(func() string {
		d := t.TempDir()
		_ = os.WriteFile(filepath.Join(d, "goodput.json"), []byte(good), 0o644)
		return d
	}(), 4)
	if err != nil || r.Size != 4 || r.SamplesPerSecond != 1234.5 || r.Efficiency != 0.8 {
		t.Fatalf("good report read as %+v, %v", r, err)
	}
}
