package config

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeTable keeps README.md's configuration table true: every
// setting appears there with its default, and it lists nothing else.
func TestReadmeTable(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatalf("read README.md: %v", err)
	}
	documented := map[string]string{} // variable → default cell
	for line := range strings.Lines(string(b)) {
		cells := strings.Split(strings.TrimSpace(line), "|")
		// "| `VOYAGER_X` | default | meaning |" splits into 5 cells.
		if len(cells) < 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`VOYAGER_") {
			continue
		}
		name := strings.Trim(strings.TrimSpace(cells[1]), "`")
		def := strings.ReplaceAll(strings.TrimSpace(cells[2]), "`", "")
		if _, dup := documented[name]; dup {
			t.Errorf("README.md lists %s twice", name)
		}
		documented[name] = def
	}
	for _, s := range Settings() {
		def, ok := documented[s.Env]
		switch {
		case !ok:
			t.Errorf("README.md's configuration table lacks %s (default %q)", s.Env, s.Default)
		case def != s.Default:
			t.Errorf("README.md gives %s the default %q; the Config tag says %q", s.Env, def, s.Default)
		}
		delete(documented, s.Env)
	}
	for name := range documented {
		t.Errorf("README.md documents %s, which Config does not have", name)
	}
}
