package console_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/relaybus/relaybus/functions/dlqreplay/console"
)

// What a browser (or anything else) gets for each path relative to the
// mount, with and without the caller let in.
func TestConsoleAnswers(t *testing.T) {
	const notFound = `{"code":"not_found","message":"the console has no %s"}` + "\n"
	cases := []struct {
		name, method, path string
		refused            bool // Authenticate says no
		code               int
		ctype, body        string // a prefix of the Content-Type; the body when not a file
		location, allow    string
	}{
		{name: "index", method: "GET", path: "/", code: 200, ctype: "text/html"},
		{name: "script", method: "GET", path: "/app.js", code: 200, ctype: "text/javascript"},
		{name: "style sheet", method: "GET", path: "/app.css", code: 200, ctype: "text/css"},
		{name: "a trailing slash is dropped", method: "GET", path: "/app.js/", code: 200, ctype: "text/javascript"},
		{name: "HEAD", method: "HEAD", path: "/", code: 200, ctype: "text/html"},
		{name: "the mount itself is redirected, relatively", method: "GET", path: "", code: 302, location: "ops/"},
		{name: "unknown file", method: "GET", path: "/nope.js", code: 404, ctype: "application/json", body: strings.Replace(notFound, "%s", "nope.js", 1)},
		{name: "no way out", method: "GET", path: "/../console.go", code: 404, ctype: "application/json", body: strings.Replace(notFound, "%s", "../console.go", 1)},
		{name: "the Go source is not served", method: "GET", path: "/console.go", code: 404, ctype: "application/json", body: strings.Replace(notFound, "%s", "console.go", 1)},
		{name: "an empty segment is not a name", method: "GET", path: "//app.js", code: 404, ctype: "application/json", body: strings.Replace(notFound, "%s", "/app.js", 1)},
		{name: "a file under a file", method: "GET", path: "/app.js/x", code: 404, ctype: "application/json", body: strings.Replace(notFound, "%s", "app.js/x", 1)},
		{name: "writes are refused before the caller is asked", method: "POST", path: "/", refused: true, code: 405, ctype: "application/json",
			body: `{"code":"method_not_allowed","message":"the console takes GET"}` + "\n", allow: "GET, HEAD"},
		{name: "a caller not let in", method: "GET", path: "/", refused: true, code: 401, body: "who are you\n"},
		{name: "a caller not let in is not redirected", method: "GET", path: "", refused: true, code: 401, body: "who are you\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := console.New(console.Options{Mount: "ops", Authenticate: func(w http.ResponseWriter, r *http.Request) bool {
				if c.refused {
					http.Error(w, "who are you", http.StatusUnauthorized)
				}
				return !c.refused
			}})
			req := httptest.NewRequest(c.method, "/", nil)
			req.URL.Path = c.path
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			res := w.Result()
			if res.StatusCode != c.code {
				t.Fatalf("%s %q: %d, want %d (%s)", c.method, c.path, res.StatusCode, c.code, w.Body)
			}
			if got := res.Header.Get("Content-Type"); c.ctype != "" && !strings.HasPrefix(got, c.ctype) {
				t.Errorf("Content-Type %q, want %s", got, c.ctype)
			}
			if c.body != "" && w.Body.String() != c.body {
				t.Errorf("body %q, want %q", w.Body, c.body)
			}
			if got := res.Header.Get("Location"); got != c.location {
				t.Errorf("Location %q, want %q", got, c.location)
			}
			if got := res.Header.Get("Allow"); got != c.allow {
				t.Errorf("Allow %q, want %q", got, c.allow)
			}
			if res.Header.Get("X-Content-Type-Options") != "nosniff" {
				t.Error("no X-Content-Type-Options: nosniff")
			}
			if c.code != 200 {
				return
			}
			for k, v := range map[string]string{"Content-Security-Policy": console.CSP, "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"} {
				if got := res.Header.Get(k); got != v {
					t.Errorf("%s %q, want %q", k, got, v)
				}
			}
			if c.method == "GET" && w.Body.Len() < 500 {
				t.Errorf("a file of %d bytes", w.Body.Len())
			}
			if c.method == "HEAD" && w.Body.Len() != 0 {
				t.Errorf("HEAD answered %d bytes", w.Body.Len())
			}
		})
	}
}

// Without Authenticate every caller loads the console (the API's token
// mode: the page asks for the token); the mount defaults to "console".
func TestConsoleWithoutAuthenticate(t *testing.T) {
	h := console.New(console.Options{})
	for path, code := range map[string]int{"/": 200, "": 302} {
		req := httptest.NewRequest("GET", "/", nil)
		req.URL.Path = path
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != code {
			t.Errorf("%q: %d, want %d", path, w.Code, code)
		}
		if code == 302 && w.Header().Get("Location") != "console/" {
			t.Errorf("redirected to %q", w.Header().Get("Location"))
		}
	}
}
