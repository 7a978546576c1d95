package rendezvous

import "hash/fnv"

// Owner returns the member of members that owns name: the one with the
// highest hash of (member, name), equal hashes going to the smaller
// member, so every caller given the same members agrees. It returns ""
// for no members.
func Owner(members []string, name string) string {
	var best string
	var bestH uint64
	for _, m := range members {
		if v := weight(m, name); best == "" || v > bestH || (v == bestH && m < best) {
			best, bestH = m, v
		}
	}
	return best
}

// weight is the hash of (member, name): FNV-1a over both, a zero byte
// between, through splitmix64's finaliser, since FNV's high bits barely
// change between similar strings and rendezvous hashing compares whole
// values.
func weight(member, name string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(member))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(name))
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
