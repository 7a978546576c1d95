package runtime_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/runtime"
)

// TestMissingCDIDevices: the devices no spec defines are missing, whether
// their spec is absent, names them otherwise (by index, not UUID) or cannot
// be parsed; a spec directory that does not exist is no error; a broken
// spec's error names its file.
func TestMissingCDIDevices(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("nvidia.yaml", `cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
- name: GPU-aaaa
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: "1"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
`)
	ask := []string{"nvidia.com/gpu=GPU-aaaa", "nvidia.com/gpu=GPU-bbbb", "nvidia.com/gpu=1", "other.com/gpu=GPU-aaaa"}
	missing, specErrs := runtime.MissingCDIDevices([]string{dir, filepath.Join(dir, "absent")}, ask)
	if specErrs != nil {
		t.Errorf("spec errors %v, want none", specErrs)
	}
	if want := []string{"nvidia.com/gpu=GPU-bbbb", "other.com/gpu=GPU-aaaa"}; !slices.Equal(missing, want) {
		t.Errorf("missing %v, want %v", missing, want)
	}

	write("broken.yaml", "cdiVersion: \"0.6.0\"\nkind: nvidia.com/gpu\ndevices: [{name: GPU-bbbb, containerEdits: {deviceNodes: [{path: /dev/nvidia1}]}\n")
	missing, specErrs = runtime.MissingCDIDevices([]string{dir}, ask)
	if want := []string{"nvidia.com/gpu=GPU-bbbb", "other.com/gpu=GPU-aaaa"}; !slices.Equal(missing, want) {
		t.Errorf("with a broken spec: missing %v, want %v", missing, want)
	}
	if specErrs == nil || !strings.Contains(specErrs.Error(), "broken.yaml") {
		t.Errorf("with a broken spec: spec errors %v, want one naming broken.yaml", specErrs)
	}
}
