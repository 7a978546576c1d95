package history

import (
	"cmp"
	"fmt"
	"slices"
	"sort"

	"github.com/voyager-gpu/voyager/state"
)

// The device rules: gpu-shared (per physical GPU), binding-differs and
// device-not-in-inventory.

// index records l's devices and describes each device that another
// allocation excludes: the same device, or its physical GPU held whole
// while a part of it is held, or the reverse (state.Holdings). A device's
// physical GPU is the one its allocation names, else the one the node's
// inventory gives it now.
func (c *Checker) index(node string, l state.Ledger) []string {
	var inv map[string]string
	if n, ok := c.nodes[node]; ok {
		inv = n.DeviceParents()
	}
	c.heldInv[node] = inv
	ids := make([]string, 0, len(l.Allocations))
	for id := range l.Allocations {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		c.held.Add(node+"/"+id, l.Allocations[id], inv)
	}
	var shared []string
	for _, id := range ids {
		shared = append(shared, c.held.Conflicts(node+"/"+id, l.Allocations[id], inv)...)
	}
	return shared
}

func (c *Checker) unindex(node string, l state.Ledger) {
	inv := c.heldInv[node]
	for id, a := range l.Allocations {
		c.held.Remove(node+"/"+id, a, inv)
	}
	delete(c.heldInv, node)
}

// sameSet reports whether a and b hold the same elements, in any order.
func sameSet[T cmp.Ordered](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y)
}

// unknownDevices describes each device that node's ledger allocates and
// its inventory (while it has one) knows neither as a device nor as the
// physical GPU the device belongs to (a GPU held whole and listed split
// now, a MIG device whose GPU is listed whole now: still there).
func (c *Checker) unknownDevices(name string) []string {
	n, ok := c.nodes[name]
	l := c.ledgers[name]
	if !ok || len(l.Allocations) == 0 {
		return nil
	}
	inv := n.DeviceParents()
	var out []string
	for id, a := range l.Allocations {
		for _, u := range a.GPUs {
			if _, known := inv[u]; known {
				continue
			}
			if p := a.Parent(u, inv); p != u {
				if _, known := inv[p]; known {
					continue
				}
			}
			out = append(out, fmt.Sprintf("%s holds device %s, which %s's inventory does not list (nor its GPU)", id, u, name))
		}
	}
	sort.Strings(out)
	return out
}
