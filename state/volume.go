package state

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"time"
)

const dirVolumes = "volumes"

// Volumes is the prefix of the operator-defined volumes.
func (k Keys) Volumes() string { return k.dir(dirVolumes) }

// Volume is the key of volume name.
func (k Keys) Volume(name string) string { return k.key(dirVolumes, name) }

// VolumeName returns the volume name of a key under volumes/.
func (k Keys) VolumeName(key string) (string, bool) {
	if !k.hasDir(dirVolumes, key) {
		return "", false
	}
	n := k.trimDir(dirVolumes, key)
	return n, n != "" && !strings.Contains(n, "/")
}

// UserPlaceholder is the part of a per-user volume's host path that is
// replaced by the session owner's name.
const UserPlaceholder = "{user}"

// Volume is a named directory an operator offers to sessions, stored at
// volumes/<name>: a host path that exists on every node (a local disk, or
// an NFS export the node mounts there), shared by the users and groups it
// names, or one directory per user.
type Volume struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// HostPath is the absolute directory on every node. With PerUser it
	// holds UserPlaceholder as one whole path segment, e.g.
	// /srv/results/{user}.
	HostPath string `json:"hostPath"`
	// PerUser gives each owner a directory of their own, HostPath with
	// UserPlaceholder replaced by the owner's name, which the agent creates
	// on first use owned by the owner's user id, mode 0700.
	PerUser bool `json:"perUser,omitempty"`
	// ReadOnly volumes are mounted read-only into every session, whatever
	// the session asks for.
	ReadOnly bool `json:"readOnly,omitempty"`
	// Users and Groups may mount the volume; both empty: everyone.
	Users  []string `json:"users,omitempty"`
	Groups []string `json:"groups,omitempty"`
	// By is the admin who wrote the definition, at Updated.
	By      string    `json:"by,omitempty"`
	Updated time.Time `json:"updated"`
}

// Allows reports whether owner, a member of groups, may mount v.
func (v Volume) Allows(owner string, groups []string) bool {
	if len(v.Users) == 0 && len(v.Groups) == 0 {
		return true
	}
	if slices.Contains(v.Users, owner) {
		return true
	}
	for _, g := range groups {
		if slices.Contains(v.Groups, g) {
			return true
		}
	}
	return false
}

// Validate checks a definition; each problem is one message naming the
// field and what would be valid.
func (v Volume) Validate() []string {
	var errs []string
	if !path.IsAbs(v.HostPath) || path.Clean(v.HostPath) != v.HostPath || v.HostPath == "/" {
		errs = append(errs, fmt.Sprintf("hostPath: got %q, want a clean absolute directory other than /, such as /srv/datasets", v.HostPath))
	}
	segs := strings.Split(v.HostPath, "/")
	whole := slices.Index(segs, UserPlaceholder) >= 0
	switch n := strings.Count(v.HostPath, UserPlaceholder); {
	case v.PerUser && (n != 1 || !whole || slices.Index(segs, UserPlaceholder) < 2):
		// Below a fixed directory: /{user} would make a user named etc
		// the owner of /etc.
		errs = append(errs, fmt.Sprintf("hostPath: a per-user volume needs %s once, as one whole path segment below a directory of its own, such as /srv/results/%s", UserPlaceholder, UserPlaceholder))
	case !v.PerUser && n > 0:
		errs = append(errs, fmt.Sprintf("hostPath: holds %s but perUser is false; set perUser, or name one directory", UserPlaceholder))
	}
	if len(v.Description) > 256 {
		errs = append(errs, "description: want at most 256 characters")
	}
	if len(v.Users)+len(v.Groups) > 256 {
		errs = append(errs, "users, groups: want at most 256 names together")
	}
	for _, u := range v.Users {
		if err := ValidateSubject("user", u); err != nil {
			errs = append(errs, "users: "+err.Error())
		}
	}
	for _, g := range v.Groups {
		if err := ValidateSubject("group", g); err != nil {
			errs = append(errs, "groups: "+err.Error())
		}
	}
	return errs
}

// HostPathFor returns the directory owner's sessions mount: HostPath, with
// UserPlaceholder replaced by owner for a per-user volume. An owner name
// that cannot be a path segment (".", "..") is an error.
func (v Volume) HostPathFor(owner string) (string, error) {
	if !v.PerUser {
		return v.HostPath, nil
	}
	if err := ValidateSubject("owner", owner); err != nil || strings.Trim(owner, ".") == "" {
		return "", fmt.Errorf("resolve volume %s: owner %q cannot name a directory", v.Name, owner)
	}
	return strings.Replace(v.HostPath, UserPlaceholder, owner, 1), nil
}

// VolumeRef names a volume to mount and where: what a session request
// and a profile ask for, before the API resolves it into a VolumeMount.
type VolumeRef struct {
	// Name is the volume's (volumes/<name>).
	Name string `json:"name"`
	// MountPath is where it appears in the containers, e.g. /data.
	MountPath string `json:"mountPath"`
	// ReadOnly mounts a read-write volume read-only; a read-only volume
	// is always mounted read-only.
	ReadOnly bool `json:"readOnly,omitempty"`
}

// VolumeMount is one volume in a session's spec, resolved by the API at
// admission from volumes/<name>: the agent mounts HostPath at MountPath
// and reads no volume definition itself, so a session runs with the
// definition it was admitted under.
type VolumeMount struct {
	Name      string `json:"name"`
	MountPath string `json:"mountPath"`
	// ReadOnly mounts it read-only: the session asked, or the volume is.
	ReadOnly bool `json:"readOnly,omitempty"`
	// HostPath is the directory on the node ({user} already replaced).
	HostPath string `json:"hostPath"`
	// PerUser makes the agent create HostPath, owned by the session's
	// user, mode 0700, when it is missing, and refuse one that exists but
	// is another user's.
	PerUser bool `json:"perUser,omitempty"`
}

// UlimitUnlimited is the value of an unlimited resource limit in Ulimits.
const UlimitUnlimited = -1

// Ulimits are the resource limits (soft and hard alike) of a session's
// processes: what NCCL, RDMA and many-worker data loaders need.
type Ulimits struct {
	// MemlockKiB is RLIMIT_MEMLOCK in KiB (ulimit -l);
	// UlimitUnlimited (-1) is unlimited, which RDMA's pinned buffers want.
	MemlockKiB int64 `json:"memlockKiB"`
	// Nofile is RLIMIT_NOFILE, open files (ulimit -n).
	Nofile int64 `json:"nofile"`
}
