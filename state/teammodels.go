package state

import (
	"fmt"
	"path"
	"sort"
	"strings"
)

// GuaranteeModelMatches reports whether key, a model of a team's
// guarantee (TeamGuarantee.Models), names GPUs of model, as the nodes
// report it: the same name; or, for a key with shell wildcards (* ? [),
// path.Match as a request's gpuModel is matched; or else a key the model
// contains ("H100" names "NVIDIA H100 80GB HBM3", "A100" every A100).
func GuaranteeModelMatches(key, model string) bool {
	if key == model {
		return true
	}
	if strings.ContainsAny(key, "*?[") {
		ok, err := path.Match(key, model)
		return err == nil && ok
	}
	return key != "" && strings.Contains(model, key)
}

// GuaranteeModelOf is the key of models (TeamGuarantee.Models, or their
// union over a tree) that a GPU of model counts for: the first in sorted
// order that matches it (GuaranteeModelMatches); "" when none does.
func GuaranteeModelOf(keys []string, model string) string {
	for _, k := range keys {
		if GuaranteeModelMatches(k, model) {
			return k
		}
	}
	return ""
}

// GuaranteeModelKeys are the model keys guaranteed anywhere in tr,
// sorted.
func (tr TeamTree) GuaranteeModelKeys() []string {
	seen := map[string]bool{}
	var out []string
	for _, t := range tr.Teams {
		for m, n := range t.Guarantee.Models {
			if n > 0 && !seen[m] {
				seen[m] = true
				out = append(out, m)
			}
		}
	}
	sort.Strings(out)
	return out
}

// validateModelKey checks a model key of a guarantee: 1-128 characters,
// and a valid pattern when it has wildcards.
func validateModelKey(m string) string {
	if strings.TrimSpace(m) == "" || len(m) > 128 {
		return fmt.Sprintf("model name %q: want 1-128 characters, the model as nodes report it (or part of it, such as \"H100\")", m)
	}
	if strings.ContainsAny(m, "*?[") {
		if _, err := path.Match(m, ""); err != nil {
			return fmt.Sprintf("model %q: not a valid pattern (%v); want a model name, part of one such as \"H100\", or a shell pattern such as \"*A100*\"", m, err)
		}
	}
	return ""
}
