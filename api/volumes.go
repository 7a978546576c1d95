package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/gin-gonic/gin"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
)

// VolumeList is GET /api/v1/volumes: the volumes the caller may mount
// (every volume for an admin), by name.
type VolumeList struct {
	Items []state.Volume `json:"items"`
}

// resolveVolumes turns a session's volumes (its request's and its
// profile's) into mounts: each volume must exist and allow owner (a
// member of groups); a per-user volume's path is owner's own. It returns
// the field errors of volumes that cannot be mounted, and the mod
// revisions of the definitions read, for the create to compare.
func (a *API) resolveVolumes(ctx context.Context, reqs []volumeAsk, owner string, groups []string) ([]state.VolumeMount, []FieldError, map[string]int64, error) {
	if len(reqs) == 0 {
		return nil, nil, nil, nil
	}
	ops := make([]clientv3.Op, len(reqs))
	for i, r := range reqs {
		ops[i] = clientv3.OpGet(a.keys.Volume(r.Name))
	}
	// One transaction: every definition is read at one revision.
	resp, err := a.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read volumes: %w", err)
	}
	var (
		out  []state.VolumeMount
		errs []FieldError
		revs = map[string]int64{}
	)
	// The same answer for a volume that does not exist and one the
	// caller may not mount: its definition is not the caller's to see.
	refuse := func(r volumeAsk) FieldError {
		if strings.HasPrefix(r.field, "profile.") { // the profile's alone
			return FieldError{Field: r.field + ".name", Message: fmt.Sprintf("profile %q mounts volume %q, which is not one you may mount (GET /api/v1/volumes lists those); choose another profile, or ask an admin to let you mount it or to take it out of the profile", r.profile, r.Name)}
		}
		return FieldError{Field: r.field + ".name", Message: fmt.Sprintf("no volume %q; GET /api/v1/volumes (voyager volume list) lists those you may mount", r.Name)}
	}
	for i, r := range reqs {
		f := r.field
		kvs := resp.Responses[i].GetResponseRange().Kvs
		if len(kvs) == 0 {
			errs = append(errs, refuse(r))
			continue
		}
		v, err := state.Decode[state.Volume](kvs[0].Value)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("read volume %s: %w", r.Name, err)
		}
		if !v.Allows(owner, groups) {
			errs = append(errs, refuse(r))
			continue
		}
		host, err := v.HostPathFor(owner)
		if err != nil {
			errs = append(errs, FieldError{Field: f + ".name", Message: err.Error()})
			continue
		}
		revs[a.keys.Volume(r.Name)] = kvs[0].ModRevision
		out = append(out, state.VolumeMount{Name: r.Name, MountPath: r.MountPath, ReadOnly: r.ReadOnly || v.ReadOnly, HostPath: host, PerUser: v.PerUser})
	}
	return out, errs, revs, nil
}

func (a *API) listVolumes(c *gin.Context) {
	p := principalOf(c)
	resp, err := a.cli.Get(c.Request.Context(), a.keys.Volumes(), clientv3.WithPrefix())
	if err != nil {
		a.internal(c, "list volumes", err)
		return
	}
	out := []state.Volume{}
	for _, kv := range resp.Kvs {
		v, err := state.Decode[state.Volume](kv.Value)
		if err == nil && (p.Admin || v.Allows(p.Subject, p.Groups)) {
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	c.JSON(http.StatusOK, VolumeList{Items: out})
}

func (a *API) getVolume(c *gin.Context) {
	p := principalOf(c)
	name := c.Param("name")
	notFound := func() {
		a.problem(c, http.StatusNotFound, "Not found", fmt.Sprintf("no volume %q; GET /api/v1/volumes lists those you may mount", truncate(name, 64)))
	}
	if state.ValidateName("volume", name) != nil {
		notFound()
		return
	}
	v, _, err := state.Get[state.Volume](c.Request.Context(), a.cli, a.keys.Volume(name))
	switch {
	case errors.Is(err, state.ErrNotFound):
		notFound()
	case err != nil:
		a.internal(c, "read volume", err)
	case !p.Admin && !v.Allows(p.Subject, p.Groups):
		notFound()
	default:
		c.JSON(http.StatusOK, v)
	}
}

func (a *API) putVolume(c *gin.Context) {
	name, ok := a.pathName(c, "volume")
	if !ok {
		return
	}
	var v state.Volume
	if !a.decodeBody(c, &v) {
		return
	}
	var errs []FieldError
	if v.Name != "" && v.Name != name {
		errs = append(errs, FieldError{Field: "name", Message: fmt.Sprintf("got %q, want %q (the name in the path) or empty", v.Name, name)})
	}
	for _, msg := range v.Validate() {
		field, text, ok := strings.Cut(msg, ": ")
		if !ok {
			field, text = "volume", msg
		}
		errs = append(errs, FieldError{Field: field, Message: text})
	}
	if len(errs) > 0 {
		a.invalid(c, "Invalid request", errs)
		return
	}
	v.Name, v.By, v.Updated = name, principalOf(c).Subject, a.cfg.Now().UTC()
	if _, err := state.Put(c.Request.Context(), a.cli, a.keys.Volume(name), v); err != nil {
		a.internal(c, "write volume", err)
		return
	}
	a.log.Info("volume defined", "volume", name, "hostPath", v.HostPath, "perUser", v.PerUser, "readOnly", v.ReadOnly, "by", v.By)
	c.JSON(http.StatusOK, v)
}

func (a *API) deleteVolume(c *gin.Context) {
	if a.deleteNamed(c, "volume", a.keys.Volume) {
		a.log.Info("volume deleted", "volume", c.Param("name"), "by", principalOf(c).Subject)
	}
}

// deleteNamed deletes the record of kind what named by the path's name at
// key(name): 204, or 404 when there is none. It reports whether it deleted.
func (a *API) deleteNamed(c *gin.Context, what string, key func(string) string) bool {
	name := c.Param("name")
	if state.ValidateName(what, name) != nil {
		a.problem(c, http.StatusNotFound, "Not found", fmt.Sprintf("no %s %q", what, truncate(name, 64)))
		return false
	}
	resp, err := a.cli.Delete(c.Request.Context(), key(name))
	if err != nil {
		a.internal(c, "delete "+what, err)
		return false
	}
	if resp.Deleted == 0 {
		a.problem(c, http.StatusNotFound, "Not found", fmt.Sprintf("no %s %q", what, name))
		return false
	}
	c.Status(http.StatusNoContent)
	return true
}

// mountVolumes resolves the volumes vols for p into s.Volumes and
// returns the compares that keep the create to the definitions it read.
// It answers the problem and returns false when a volume is refused or
// cannot be read.
func (a *API) mountVolumes(c *gin.Context, vols []volumeAsk, p Principal, s *state.Session) ([]clientv3.Cmp, bool) {
	mounts, verrs, revs, err := a.resolveVolumes(c.Request.Context(), vols, p.Subject, p.Groups)
	if err != nil {
		a.internal(c, "resolve volumes", err)
		return nil, false
	}
	if len(verrs) > 0 {
		a.invalid(c, "Invalid request", verrs)
		return nil, false
	}
	s.Volumes = mounts
	var guards []clientv3.Cmp
	for key, rev := range revs {
		guards = append(guards, clientv3.Compare(clientv3.ModRevision(key), "=", rev))
	}
	return guards, true
}
