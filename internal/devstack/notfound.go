package devstack

import (
	"encoding/json"
	"net/http"
)

// notFound answers the stack's unknown paths (a /consume/<subscription>
// no consumer has, a typo) with a JSON 404, as the functions answer theirs.
type notFound struct{}

func (notFound) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if len(path) > 200 {
		path = path[:200] + "…"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusNotFound)
	_ = json.NewEncoder(w).Encode(map[string]string{"code": "not_found", "message": "no function of the local stack serves " + r.Method + " " + path})
}
