// Package rendezvous shares names among members by rendezvous (highest
// random weight) hashing: each name goes to the member with the highest
// hash of (member, name), so a member joining or leaving moves only its
// own share. The placers share nodes and advisory writes by it, and the
// placer processes' status mergers share sessions.
package rendezvous
