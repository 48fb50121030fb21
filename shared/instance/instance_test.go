package instance

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

func TestLazyRetriesAFailedBuildAndBuildsOnce(t *testing.T) {
	builds := 0
	fail := true
	h := Lazy("test", func(context.Context) (http.Handler, error) {
		builds++
		if fail {
			return nil, errors.New("database unreachable")
		}
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }), nil
	})
	serve := func() *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h(rec, httptest.NewRequest(http.MethodPost, "/", nil))
		return rec
	}
	if rec := serve(); rec.Code != http.StatusInternalServerError {
		t.Fatalf("failed build: status %d, want 500", rec.Code)
	}
	fail = false
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if rec := serve(); rec.Code != http.StatusTeapot {
				t.Errorf("status %d, want 418", rec.Code)
			}
		}()
	}
	wg.Wait()
	if builds != 2 {
		t.Fatalf("built %d times, want 2 (one failure, then once for every later request)", builds)
	}
}

func TestPostgresNamesTheMissingVariable(t *testing.T) {
	if _, err := Postgres(context.Background(), ""); err == nil || err.Error() != "DATABASE_URL is not set" {
		t.Fatalf("err = %v", err)
	}
}
