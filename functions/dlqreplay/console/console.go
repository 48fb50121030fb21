// Package console serves the operators' web console: a small single-page
// application (index.html, one script, one style sheet; no build step and
// nothing fetched from elsewhere) that calls the operations API of
// functions/dlqreplay, which mounts this handler under /console/.
//
// The files hold no data; who may load them is the mounting API's call
// (Options.Authenticate). Every file is served with a strict
// Content-Security-Policy (its own files only: no inline script, no other
// origin), X-Frame-Options DENY, no referrer and Cache-Control no-cache.
// Anything but GET and HEAD answers 405, a name the console lacks a JSON
// 404, both in the API's error shape ({"code", "message"}).
package console

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// files are the console's files.
//
//go:embed index.html app.js app.css
var files embed.FS

// CSP keeps the console to its own files: no inline script, no other
// origin.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

// Options configure the console's handler.
type Options struct {
	// Mount is the path segment the console is mounted under ("console"
	// when empty): a request for the mount itself, without its trailing
	// slash (a stripped path of ""), is redirected to Mount + "/",
	// relatively, so it holds under any prefix.
	Mount string
	// Authenticate, when set, is asked before anything but the method is
	// checked: it answers the request itself (a 401) and returns false
	// when the caller may not load the console. Nil lets every caller
	// load it (the API's token mode: a browser cannot add the token
	// header to a page load, so the page asks for the token and sends it
	// with every API call).
	Authenticate func(w http.ResponseWriter, r *http.Request) bool
}

// Handler serves the console's files by the request's path relative to
// the mount: "" (redirected), "/" for index.html, "/app.js", ... (a
// trailing slash is dropped).
type Handler struct {
	mount string
	auth  func(w http.ResponseWriter, r *http.Request) bool
}

// New returns the console's handler.
func New(o Options) *Handler {
	if o.Mount == "" {
		o.Mount = "console"
	}
	return &Handler{mount: o.Mount, auth: o.Authenticate}
}

// ServeHTTP serves one of the console's files.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "the console takes GET")
		return
	}
	if h.auth != nil && !h.auth(w, r) {
		return
	}
	if r.URL.Path == "" {
		w.Header().Set("Location", h.mount+"/")
		w.WriteHeader(http.StatusFound)
		return
	}
	name := strings.TrimPrefix(strings.TrimRight(r.URL.Path, "/"), "/")
	if name == "" {
		name = "index.html"
	}
	b, err := files.ReadFile(name)
	if err != nil || strings.Contains(name, "..") {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("the console has no %s", clip(name, 100)))
		return
	}
	hd := w.Header()
	hd.Set("Content-Security-Policy", CSP)
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cache-Control", "no-cache")
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(b))
}

// writeError answers in the API's error shape.
func writeError(w http.ResponseWriter, code int, short, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(struct {
		Code string `json:"code"`
		Msg  string `json:"message"`
	}{short, msg})
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
