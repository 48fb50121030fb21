package dlqreplay

import (
	"bytes"
	"embed"
	"net/http"
	"path"
	"strings"
	"time"
)

// consoleFiles is the console: a small single-page application (HTML, one
// script, one style sheet, no build step and nothing fetched from elsewhere)
// that calls this API.
//
//go:embed console
var consoleFiles embed.FS

// consoleCSP keeps the console to its own files: no inline script, no
// other origin.
const consoleCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

// serveConsole serves the console under /console/. The files hold no data,
// but they are behind the API's auth all the same, except in token mode:
// a browser cannot add the token header to a page load, so the page asks
// for the token and sends it with every API call.
func (a *api) serveConsole(w http.ResponseWriter, r *http.Request, rid string) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeJSON(w, http.StatusMethodNotAllowed, fail(http.StatusMethodNotAllowed, "method_not_allowed", "the console takes GET"))
		return
	}
	if a.o.Auth != AuthToken {
		if _, err := a.authenticate(r); err != nil {
			a.unauthenticated(w, err)
			return
		}
	}
	p := strings.TrimPrefix(strings.Trim(r.URL.Path, "/"), "console")
	if p == "" && !strings.HasSuffix(r.URL.Path, "/") {
		// Relative, so it holds under any prefix (http.Redirect would
		// resolve it against the stripped path).
		w.Header().Set("Location", path.Base(r.URL.Path)+"/")
		w.WriteHeader(http.StatusFound)
		return
	}
	name := strings.TrimPrefix(p, "/")
	if name == "" {
		name = "index.html"
	}
	b, err := consoleFiles.ReadFile("console/" + name)
	if err != nil || strings.Contains(name, "..") {
		writeJSON(w, http.StatusNotFound, fail(http.StatusNotFound, "not_found", "the console has no %s", clip(name, 100)))
		return
	}
	h := w.Header()
	h.Set("Content-Security-Policy", consoleCSP)
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache")
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(b))
}
