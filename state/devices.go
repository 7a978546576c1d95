package state

import (
	"fmt"
	"sort"
)

// Devices are physical first: every allocatable device (a whole GPU, a MIG
// device of a partitioned GPU, a fraction of a shared GPU) belongs to one
// physical GPU by UUID, and exclusivity is decided per physical GPU. A
// device held whole excludes every part of its GPU; a part (a MIG device)
// excludes its GPU held whole; two distinct parts of one GPU exclude only
// themselves. A fraction (share.go) excludes its GPU held whole and every
// MIG device of it; fractions of one GPU exclude none of each other, and
// their memory sums to at most the GPU's (FractionMiB). What a ledger
// holds counts against its physical GPUs until the allocation ends, even
// when a node registers again with an inventory that no longer lists the
// device (a GPU split into MIG devices, or MIG turned off): the allocation
// names each part's physical GPU itself (Allocation.Parents).

// Parent returns the physical GPU that device u of a belongs to: the one
// a.Parents names, else the one inv's inventory names (MIG devices of a
// partitioned GPU), else u itself (a whole GPU, or a device nobody can
// place any more: it still excludes itself).
func (a Allocation) Parent(u string, inv map[string]string) string {
	if p := a.Parents[u]; p != "" {
		return p
	}
	if p := inv[u]; p != "" {
		return p
	}
	return u
}

// DeviceParents maps every device of n's inventory to its physical GPU: a
// whole GPU to itself, a MIG device to the GPU it is a part of. The UUID of
// a partitioned GPU maps to itself too (it is no allocatable device, but a
// whole-GPU allocation of it from before the partition still holds it).
func (n Node) DeviceParents() map[string]string {
	m := make(map[string]string, len(n.GPUs))
	for _, g := range n.GPUs {
		m[g.UUID] = g.UUID
		for _, d := range g.MIGDevices {
			m[d.UUID] = g.UUID
		}
	}
	return m
}

// Holdings indexes what allocations hold, per device and per physical GPU,
// to answer which holder excludes a device. Holders are names the caller
// chooses (a session id; "node/session" across nodes).
type Holdings struct {
	device map[string]map[string]bool // device UUID → holders
	whole  map[string]map[string]bool // physical GPU held whole → holders
	parts  map[string]map[string]bool // physical GPU → holders of a part of it
	// frac: physical GPU → holders of a fraction of it (share.go), with
	// the fraction's memory.
	frac map[string]map[string]int64
}

// NewHoldings returns an empty index.
func NewHoldings() *Holdings {
	return &Holdings{device: map[string]map[string]bool{}, whole: map[string]map[string]bool{}, parts: map[string]map[string]bool{}, frac: map[string]map[string]int64{}}
}

// HoldingsOf indexes ledger l, whose node's inventory maps devices to
// physical GPUs as inv (Node.DeviceParents; nil when the node has none
// now), with session ids as holders.
func HoldingsOf(l Ledger, inv map[string]string) *Holdings {
	h := NewHoldings()
	for id, a := range l.Allocations {
		h.Add(id, a, inv)
	}
	return h
}

func addTo(m map[string]map[string]bool, k, holder string) {
	s := m[k]
	if s == nil {
		s = map[string]bool{}
		m[k] = s
	}
	s[holder] = true
}

func removeFrom(m map[string]map[string]bool, k, holder string) {
	if s := m[k]; s != nil {
		delete(s, holder)
		if len(s) == 0 {
			delete(m, k)
		}
	}
}

// Add records holder's allocation a.
func (h *Holdings) Add(holder string, a Allocation, inv map[string]string) {
	if a.Share != nil {
		for _, u := range a.GPUs {
			p := a.Parent(u, inv)
			s := h.frac[p]
			if s == nil {
				s = map[string]int64{}
				h.frac[p] = s
			}
			s[holder] = a.Share.MemoryMiB
		}
		return
	}
	for _, u := range a.GPUs {
		p := a.Parent(u, inv)
		addTo(h.device, u, holder)
		if p == u {
			addTo(h.whole, p, holder)
		} else {
			addTo(h.parts, p, holder)
		}
	}
}

// Remove forgets holder's allocation a, indexed with the same inv.
func (h *Holdings) Remove(holder string, a Allocation, inv map[string]string) {
	if a.Share != nil {
		for _, u := range a.GPUs {
			p := a.Parent(u, inv)
			if s := h.frac[p]; s != nil {
				delete(s, holder)
				if len(s) == 0 {
					delete(h.frac, p)
				}
			}
		}
		return
	}
	for _, u := range a.GPUs {
		p := a.Parent(u, inv)
		removeFrom(h.device, u, holder)
		if p == u {
			removeFrom(h.whole, p, holder)
		} else {
			removeFrom(h.parts, p, holder)
		}
	}
}

// Excluders returns, sorted, the holders other than self whose
// allocations exclude device u of physical GPU parent (parent == u: a
// whole GPU): a holder of u itself, of the whole GPU when u is a part, of
// any part of it when u is whole; of a fraction of its GPU either way.
func (h *Holdings) Excluders(u, parent, self string) []string {
	set := map[string]bool{}
	for x := range h.device[u] {
		set[x] = true
	}
	if parent == u {
		for x := range h.parts[u] {
			set[x] = true
		}
	} else {
		for x := range h.whole[parent] {
			set[x] = true
		}
	}
	for x := range h.frac[parent] {
		set[x] = true
	}
	return sortedOthers(set, self)
}

// FractionExcluders returns, sorted, the holders other than self whose
// allocations exclude a fraction of physical GPU p: a holder of p whole
// or of a MIG device of p. Other fractions of p exclude none; their
// memory counts (FractionMiB).
func (h *Holdings) FractionExcluders(p, self string) []string {
	set := map[string]bool{}
	for x := range h.whole[p] {
		set[x] = true
	}
	for x := range h.parts[p] {
		set[x] = true
	}
	return sortedOthers(set, self)
}

// FractionMiB returns the memory the fractions of physical GPU p hold,
// but self's.
func (h *Holdings) FractionMiB(p, self string) int64 {
	var sum int64
	for x, mib := range h.frac[p] {
		if x != self {
			sum += mib
		}
	}
	return sum
}

// SharedGPUs returns, sorted, the physical GPUs of which a fraction is
// held.
func (h *Holdings) SharedGPUs() []string {
	out := make([]string, 0, len(h.frac))
	for p := range h.frac {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

func sortedOthers(set map[string]bool, self string) []string {
	delete(set, self)
	out := make([]string, 0, len(set))
	for x := range set {
		out = append(out, x)
	}
	sort.Strings(out)
	return out
}

// Conflicts describes each device of holder's allocation a that another
// holder of h excludes (Excluders), as "device U (of physical GPU P) is
// held by X": empty when a may be held beside them.
func (h *Holdings) Conflicts(holder string, a Allocation, inv map[string]string) []string {
	var out []string
	for _, u := range a.GPUs {
		p := a.Parent(u, inv)
		if a.Share != nil {
			if others := h.FractionExcluders(p, holder); len(others) > 0 {
				out = append(out, fmt.Sprintf("a fraction of GPU %s held by %s and the GPU whole or a MIG device of it by %v", p, holder, others))
			}
			continue
		}
		others := h.Excluders(u, p, holder)
		if len(others) == 0 {
			continue
		}
		what := "GPU " + u
		switch {
		case p != u:
			what = fmt.Sprintf("device %s of GPU %s", u, p)
		case h.frac[u] != nil && len(h.device[u]) <= 1:
			what = fmt.Sprintf("GPU %s (whole, while fractions of it are held)", u)
		case h.parts[u] != nil && len(h.device[u]) <= 1:
			what = fmt.Sprintf("GPU %s (whole, while parts of it are held)", u)
		}
		out = append(out, fmt.Sprintf("%s held by %s and %v", what, holder, others))
	}
	return out
}

// Holders maps every allocatable device of n's inventory (whole GPUs, and
// MIG devices of split ones) that ledger l keeps from being free to the
// session that does: one that holds the device, its GPU whole or a MIG
// device of it (Holdings), or that the agent withheld the GPU for
// (GPU.HeldBy) while it holds anything on the node. A device not in it
// is free. Views of the cluster's free GPUs read it, as the placer does.
func Holders(n Node, l Ledger) map[string]string {
	inv := n.DeviceParents()
	h := HoldingsOf(l, inv)
	out := map[string]string{}
	mark := func(u, parent string, withheld string) {
		if others := h.Excluders(u, parent, ""); len(others) > 0 {
			out[u] = others[0]
		} else if withheld != "" {
			out[u] = withheld
		}
	}
	for _, g := range n.GPUs {
		withheld := ""
		if _, holds := l.Allocations[g.HeldBy]; g.HeldBy != "" && holds {
			withheld = g.HeldBy
		}
		if !g.MIGEnabled {
			mark(g.UUID, g.UUID, withheld)
			continue
		}
		for _, m := range g.MIGDevices {
			mark(m.UUID, g.UUID, withheld)
		}
	}
	return out
}
