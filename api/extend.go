package api

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/gin-gonic/gin"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
)

// ExtendRequest is the body of POST /api/v1/sessions/{id}/extend.
type ExtendRequest struct {
	// By is how much longer the session may run, a Go duration such as
	// "2h": its max runtime becomes the current one plus By.
	By state.Duration `json:"by"`
}

// maxExtendAttempts bounds the read-modify-write retries of an extension
// that races other writers of the spec.
const maxExtendAttempts = 16

// extendSession raises a live session's max runtime by the body's "by":
// the limit that applies now (the spec's, else the cluster default) plus
// by, written into the spec's limits.maxRuntime in a transaction
// conditional on the spec being unchanged since read. The lifecycle
// controller reads the new limit from the spec; a MaxRuntime warning whose
// stop the new limit moves beyond the warning window is withdrawn by it.
func (a *API) extendSession(c *gin.Context) {
	v, ok := a.loadVisible(c)
	if !ok {
		return
	}
	var req ExtendRequest
	if !a.decodeBody(c, &req) {
		return
	}
	if req.By <= 0 {
		a.invalid(c, "Invalid request", []FieldError{{Field: "by", Message: fmt.Sprintf("got %s, want a positive duration such as \"2h\"", req.By.Std())}})
		return
	}
	ctx := c.Request.Context()
	p := principalOf(c)
	for range maxExtendAttempts {
		cur, modRev, found, err := a.readSessionRev(ctx, v.ID)
		if err != nil || !found {
			if err == nil {
				err = state.ErrNotFound
			}
			a.extendFailed(c, v.ID, err)
			return
		}
		v = cur
		if !a.extendable(c, v) {
			return
		}
		limit := a.effectiveMaxRuntime(v.Session)
		next := limit + req.By.Std()
		if next < limit { // overflow: far beyond any cap
			a.invalid(c, "Invalid request", []FieldError{{Field: "by", Message: fmt.Sprintf("got %s, which is longer than any max runtime can be", req.By.Std())}})
			return
		}
		if capd := a.cfg.MaxRuntimeCap; capd > 0 && next > capd {
			left := max(capd-limit, 0)
			msg := fmt.Sprintf("the cluster caps max runtime at %s and this session's limit is %s, so at most %s may still be added; got %s", capd, limit, left, req.By.Std())
			if left == 0 {
				msg = fmt.Sprintf("the cluster caps max runtime at %s and this session's limit is %s already: nothing more may be added", capd, limit)
			}
			a.problem(c, http.StatusUnprocessableEntity, "Over the max runtime cap", msg, FieldError{Field: "by", Message: fmt.Sprintf("want at most %s", left)})
			return
		}
		spec := v.Session
		spec.Limits.MaxRuntime = state.Duration(next)
		b, err := state.Encode(spec)
		if err != nil {
			a.internal(c, "extend session", fmt.Errorf("encode session %s: %w", v.ID, err))
			return
		}
		key := a.keys.Session(v.ID)
		resp, err := a.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", modRev)).Then(clientv3.OpPut(key, b)).Commit()
		if err != nil {
			a.internal(c, "extend session", fmt.Errorf("write session %s: %w", v.ID, err))
			return
		}
		if !resp.Succeeded {
			continue // the spec changed since read: read it again
		}
		by := p.Subject
		if p.Service != "" {
			by += " via " + p.Service
		}
		a.log.Info("session extended", "session", v.ID, "by", by, "from", limit, "to", next)
		v.Session = spec
		c.JSON(http.StatusOK, a.present(c, v))
		return
	}
	a.problem(c, http.StatusConflict, "Conflict", fmt.Sprintf("session %s changed %d times while being extended; retry", v.ID, maxExtendAttempts))
}

// extendable answers 409 for a session that cannot be extended: ended,
// stopping, or without a max runtime. It returns true when it can be.
func (a *API) extendable(c *gin.Context, v SessionView) bool {
	switch {
	case v.Status.Phase.Terminal():
		a.problem(c, http.StatusConflict, "Conflict", fmt.Sprintf("session %s has ended (%s): there is nothing to extend", v.ID, v.Status.Phase))
		return false
	case v.Stopping() || v.Status.Phase == state.PhaseStopping:
		why := "its owner asked it to stop"
		if v.Eviction != nil {
			why = "it is being stopped: " + v.Eviction.Reason
			if v.Eviction.Message != "" {
				why += " (" + v.Eviction.Message + ")"
			}
		}
		a.problem(c, http.StatusConflict, "Conflict", fmt.Sprintf("session %s is stopping (%s): there is nothing to extend", v.ID, why))
		return false
	case a.effectiveMaxRuntime(v.Session) == 0:
		a.problem(c, http.StatusConflict, "Conflict", fmt.Sprintf("session %s has no max runtime (neither its limits nor the cluster default set one): it may already run as long as it likes, so there is nothing to extend", v.ID))
		return false
	}
	return true
}

func (a *API) extendFailed(c *gin.Context, id string, err error) {
	if errors.Is(err, state.ErrNotFound) {
		a.problem(c, http.StatusNotFound, "Not found", fmt.Sprintf("no session %q", id))
		return
	}
	a.internal(c, "extend session", err)
}
