package console

import (
	"bytes"
	"compress/gzip"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
)

//go:embed assets templates
var files embed.FS

// Prefix is where the console is served.
const Prefix = "/console/"

// Pages are the console's pages, in the order of its navigation.
var Pages = []string{"cluster", "queue", "sessions", "history", "admin"}

var titles = map[string]string{
	"cluster":  "Cluster",
	"queue":    "Queue",
	"sessions": "My sessions",
	"history":  "History",
	"admin":    "Admin",
}

// Config tunes the console.
type Config struct {
	// Logger receives the console's logs. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Console serves the pages. Build it with New and register it with
// Register (or Mount).
type Console struct {
	api    http.Handler
	cfg    Config
	tmpl   *template.Template
	assets http.Handler
}

// New builds the console over api, the handler of the JSON API
// (api.API.Handler) that every view calls in-process.
func New(api http.Handler, cfg Config) (*Console, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	t, err := template.New("console").Funcs(funcs(cfg.Now)).ParseFS(files, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("parse console templates: %w", err)
	}
	sub, err := fs.Sub(files, "assets")
	if err != nil {
		return nil, fmt.Errorf("open console assets: %w", err)
	}
	return &Console{api: api, cfg: cfg, tmpl: t, assets: http.StripPrefix(Prefix+"static/", http.FileServer(http.FS(sub)))}, nil
}

// Engine is what the console registers itself on: the API's gin engine.
type Engine interface {
	gin.IRouter
	http.Handler
}

// Mount builds a console over the API's engine e, registers it there and
// routes Prefix and / on mux to it. Call it before serving.
func Mount(e Engine, mux *http.ServeMux, cfg Config) error {
	c, err := New(e, cfg)
	if err != nil {
		return err
	}
	c.Register(e)
	mux.Handle(Prefix, e)
	mux.Handle("GET /{$}", http.RedirectHandler(Prefix, http.StatusFound))
	return nil
}

// Register adds the console's routes under Prefix to r.
func (c *Console) Register(r gin.IRouter) {
	g := r.Group(Prefix)
	g.Use(securityHeaders)
	g.GET("", func(ctx *gin.Context) { ctx.Redirect(http.StatusFound, Prefix+"cluster") })
	g.GET("static/*file", func(ctx *gin.Context) {
		ctx.Header("Cache-Control", "no-cache")
		c.assets.ServeHTTP(ctx.Writer, ctx.Request)
	})
	g.GET(":page", c.shell)
	g.GET("view/:page", c.view)
	g.POST("do/*action", c.do)
}

// securityHeaders keeps the pages to their own origin: no inline script,
// no framing, nothing fetched from elsewhere.
func securityHeaders(ctx *gin.Context) {
	h := ctx.Writer.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	ctx.Next()
}

// shellData is a page's shell: navigation and the place the view goes.
type shellData struct {
	Page, Title string
	Nav         []navItem
}

type navItem struct{ Page, Title string }

func (c *Console) shell(ctx *gin.Context) {
	page := ctx.Param("page")
	if _, ok := titles[page]; !ok && page != "signin" {
		ctx.Data(http.StatusNotFound, "text/plain; charset=utf-8", []byte(fmt.Sprintf("no console page %q; the pages are %s", page, strings.Join(Pages, ", "))))
		return
	}
	d := shellData{Page: page, Title: titles[page]}
	if page == "signin" {
		d.Title = "Sign in"
	}
	for _, p := range Pages {
		d.Nav = append(d.Nav, navItem{p, titles[p]})
	}
	c.render(ctx, http.StatusOK, "shell", d)
}

func (c *Console) render(ctx *gin.Context, code int, name string, data any) {
	var buf bytes.Buffer
	if err := c.tmpl.ExecuteTemplate(&buf, name, data); err != nil {
		c.cfg.Logger.Error("render console page", "template", name, "err", err)
		ctx.Data(http.StatusInternalServerError, "text/plain; charset=utf-8", []byte("the console failed to render this page; the log has details"))
		return
	}
	ctx.Header("Cache-Control", "no-store")
	ctx.Header("Vary", "Accept-Encoding")
	body := buf.Bytes()
	// A large cluster's view is mostly repeated markup: gzip makes it a
	// tenth of the size on the wire (BenchmarkClusterPage).
	if len(body) > 8<<10 && strings.Contains(ctx.GetHeader("Accept-Encoding"), "gzip") {
		var z bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&z, gzip.BestSpeed)
		if _, err := zw.Write(body); err == nil && zw.Close() == nil {
			ctx.Header("Content-Encoding", "gzip")
			body = z.Bytes()
		}
	}
	ctx.Data(code, "text/html; charset=utf-8", body)
}

// caller calls the JSON API in-process as the viewer: every request
// carries the viewer's own Authorization header, so the API decides what
// the viewer may see and do. It counts its calls.
type caller struct {
	api   http.Handler
	auth  string
	ctx   *gin.Context
	calls int
}

// apiError is an answer of the API other than 2xx: its status and the
// problem's detail.
type apiError struct {
	Status int
	Title  string
	Detail string
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Title, e.Detail) }

// recorder is a minimal in-memory http.ResponseWriter.
type recorder struct {
	h    http.Header
	code int
	body bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.h }
func (r *recorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
}
func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(p)
}

// call sends method path (with a JSON body when in is not nil) and decodes
// a 2xx answer into out.
func (k *caller) call(method, path string, in, out any) error {
	var body io.Reader = http.NoBody
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(k.ctx.Request.Context(), method, path, body)
	if err != nil {
		return fmt.Errorf("build api request: %w", err)
	}
	req.Header.Set("Authorization", k.auth)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.RemoteAddr = k.ctx.Request.RemoteAddr
	rec := &recorder{h: http.Header{}}
	k.calls++
	k.api.ServeHTTP(rec, req)
	if rec.code < 200 || rec.code > 299 {
		var p struct{ Title, Detail string }
		_ = json.Unmarshal(rec.body.Bytes(), &p)
		if p.Detail == "" {
			p.Detail = strings.TrimSpace(rec.body.String())
		}
		return &apiError{Status: rec.code, Title: p.Title, Detail: p.Detail}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(rec.body.Bytes(), out); err != nil {
		return fmt.Errorf("decode %s %s: %w", method, path, err)
	}
	return nil
}

func (c *Console) caller(ctx *gin.Context) *caller {
	return &caller{api: c.api, auth: ctx.GetHeader("Authorization"), ctx: ctx}
}

// fail renders an API refusal (or a failure) as the view, with the API's
// status, so that the script can send the user to sign in on a 401.
func (c *Console) fail(ctx *gin.Context, k *caller, err error) {
	code, title, detail := http.StatusBadGateway, "Failed", err.Error()
	if ae, ok := err.(*apiError); ok {
		code, title, detail = ae.Status, ae.Title, ae.Detail
	}
	ctx.Header("X-Voyager-API-Calls", fmt.Sprint(k.calls))
	c.render(ctx, code, "error", map[string]any{"Status": code, "Title": title, "Detail": detail})
}

// q escapes a path segment or query value.
func q(s string) string { return url.PathEscape(s) }
