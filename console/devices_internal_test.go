package console

import (
	"path"
	"testing"

	"github.com/voyager-gpu/voyager/state"
)

// TestDeviceChoiceAsksForItsModelAlone: a MIG or shared device chosen in
// the start form asks for its model by a gpuModel pattern that matches
// that model name and no other, even one with path.Match's metacharacters.
func TestDeviceChoiceAsksForItsModelAlone(t *testing.T) {
	model := `GPU [rev 2]*?\x`
	for _, v := range []string{"mig:1g.10gb:" + model, "shared:" + model} {
		var res state.Resources
		form := map[string]string{"device": v, "gpuShareMiB": "1024"}
		if _, err := applyDevice(&res, func(k string) string { return form[k] }); err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		if ok, err := path.Match(res.GPUModel, model); err != nil || !ok {
			t.Errorf("%s: pattern %q does not match %q (%v)", v, res.GPUModel, model, err)
		}
		if ok, _ := path.Match(res.GPUModel, "GPU r*?\\x"); ok {
			t.Errorf("%s: pattern %q matches another model", v, res.GPUModel)
		}
	}
}
