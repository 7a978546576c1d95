package history

import (
	"fmt"
	"sort"
	"strings"

	"github.com/voyager-gpu/voyager/state"
)

// overShared describes how node's ledger l overfills its shared GPUs
// (state/share.go): over lists each GPU whose fractions hold more memory
// than the GPU has, owners each GPU whose fractions belong to more than
// one owner (classic MPS serves one user at a time). A GPU's memory is the
// least of what its fractions recorded at their binds
// (GPUShare.GPUMemoryMiB) and what the node's inventory says now.
// Fractions beside a whole or MIG holder of their GPU are gpu-shared's
// (Checker.index, state.Holdings).
func (c *Checker) overShared(node string, l state.Ledger) (over, owners []string) {
	fr := l.Fractions()
	if len(fr) == 0 {
		return nil, nil
	}
	limit := map[string]int64{}
	if n, ok := c.nodes[node]; ok {
		for _, g := range n.GPUs {
			if g.MemoryMiB > 0 {
				limit[g.UUID] = g.MemoryMiB
			}
		}
	}
	for _, a := range l.Allocations {
		if a.Share == nil || a.Share.GPUMemoryMiB <= 0 {
			continue
		}
		for _, u := range a.GPUs {
			if m, ok := limit[u]; !ok || a.Share.GPUMemoryMiB < m {
				limit[u] = a.Share.GPUMemoryMiB
			}
		}
	}
	gpus := make([]string, 0, len(fr))
	for p := range fr {
		gpus = append(gpus, p)
	}
	sort.Strings(gpus)
	for _, p := range gpus {
		s := fr[p]
		if m, ok := limit[p]; ok && s.MemoryMiB > m {
			over = append(over, fmt.Sprintf("fractions of GPU %s hold %d MiB of its %d MiB", p, s.MemoryMiB, m))
		}
		if len(s.Owners) > 1 {
			os := make([]string, 0, len(s.Owners))
			for o := range s.Owners {
				os = append(os, o)
			}
			sort.Strings(os)
			owners = append(owners, fmt.Sprintf("fractions of shared GPU %s belong to %s", p, strings.Join(os, ", ")))
		}
	}
	return over, owners
}
