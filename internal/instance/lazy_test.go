package instance

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A failed start answers 500 without the error's text (it names database
// hosts and users), and the next request builds again.
func TestLazyHidesTheStartError(t *testing.T) {
	builds := 0
	h := Lazy("relay", func(context.Context) (http.Handler, error) {
		builds++
		if builds == 1 {
			return nil, errors.New("postgres: failed to connect to `user=relaybus_main database=relaybus_main`: /cloudsql/p:r:i/.s.PGSQL.5432")
		}
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }), nil
	})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", nil))
	if rec.Code != http.StatusInternalServerError {
		t.Fatalf("failed start answered %d, want 500", rec.Code)
	}
	for _, secret := range []string{"relaybus_main", "cloudsql", "postgres:"} {
		if strings.Contains(rec.Body.String(), secret) {
			t.Errorf("the 500 body %q carries %q", rec.Body.String(), secret)
		}
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", nil))
	if rec.Code != http.StatusNoContent || builds != 2 {
		t.Errorf("second request: %d after %d builds, want 204 after 2", rec.Code, builds)
	}
}
