package api

import (
	"context"
	"fmt"
	"net/http"
	"slices"

	"github.com/gin-gonic/gin"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
)

// profileUsable checks that a session can be made from p: it builds the
// session a create naming p alone would build (kind and, for batch, a
// command filled in where p leaves them to the request) and passes each
// refusal to add, unless add has already been told about that field. A
// profile that fails here makes every create from it fail (a reserved
// variable in env cannot be taken out by a request), so it is refused at
// the PUT rather than stored.
func (a *API) profileUsable(p state.Profile, reported []FieldError, add func(field, format string, args ...any)) {
	req := SessionRequest{Profile: p.Name}
	if p.Kind == "" {
		req.Kind = state.KindNotebook
	}
	if p.Kind == state.KindBatch {
		req.Command = []string{"true"}
	}
	s, _, errs := buildSession(req, &p, a.admission())
	errs = append(errs, admissionHoles(s, a.cfg.AllowedRegistries)...)
	for _, e := range errs {
		if slices.ContainsFunc(reported, func(r FieldError) bool { return r.Field == e.Field }) {
			continue
		}
		add(e.Field, "%s (every session made from this profile would be refused)", e.Message)
	}
}

// nodeKnown reports whether node is registered (nodes/<node>, while its
// agent holds its lease) or has a ledger (a node whose agent is down keeps
// one), so that a cordon names a machine that exists.
func (a *API) nodeKnown(ctx context.Context, node string) (bool, error) {
	resp, err := a.cli.Txn(ctx).Then(
		clientv3.OpGet(a.keys.Node(node), clientv3.WithCountOnly()),
		clientv3.OpGet(a.keys.Ledger(node), clientv3.WithCountOnly()),
	).Commit()
	if err != nil {
		return false, fmt.Errorf("read node %s: %w", node, err)
	}
	for _, r := range resp.Responses {
		if r.GetResponseRange().Count > 0 {
			return true, nil
		}
	}
	return false, nil
}

// requireKnownNode answers 404 for a node that is neither registered nor
// has a ledger, naming the nodes that are. It returns false after
// answering.
func (a *API) requireKnownNode(c *gin.Context, node string) bool {
	ok, err := a.nodeKnown(c.Request.Context(), node)
	if err != nil {
		a.internal(c, "read node", err)
		return false
	}
	if !ok {
		names := make([]string, 0)
		for _, n := range a.nodes.List() {
			names = append(names, n.Value.Name)
		}
		slices.Sort(names)
		known := "none is registered"
		switch {
		case len(names) > 10:
			known = fmt.Sprintf("registered: %v and %d more", names[:10], len(names)-10)
		case len(names) > 0:
			known = fmt.Sprintf("registered: %v", names)
		}
		a.problem(c, http.StatusNotFound, "Not found", fmt.Sprintf("no node %q (%s); GET /api/v1/nodes lists them", node, known))
		return false
	}
	return true
}
