package identity_test

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/relaybus/relaybus/shared/identity"
)

func token(claims map[string]any) string {
	enc := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	return enc(map[string]string{"alg": "RS256"}) + "." + enc(claims) + ".SIGNATURE_REMOVED_BY_GOOGLE"
}

func TestFromCloudRun(t *testing.T) {
	google := "https://accounts.google.com"
	for _, c := range []struct {
		name    string
		headers map[string]string
		email   string
		service string
		err     bool
		noToken bool
	}{
		{name: "none", noToken: true, err: true},
		{name: "basic", headers: map[string]string{"Authorization": "Basic eDp5"}, noToken: true, err: true},
		{name: "not a JWT", headers: map[string]string{"Authorization": "Bearer abc"}, err: true},
		{name: "not Google's", headers: map[string]string{"Authorization": "Bearer " + token(map[string]any{"iss": "https://evil.example", "email": "a@b.c"})}, err: true},
		{name: "nobody", headers: map[string]string{"Authorization": "Bearer " + token(map[string]any{"iss": google})}, err: true},
		{name: "a service account", headers: map[string]string{"Authorization": "Bearer " + token(map[string]any{"iss": google, "email": "Order-Service@p.iam.gserviceaccount.com", "sub": "1"})},
			email: "order-service@p.iam.gserviceaccount.com", service: "order-service"},
		{name: "a user", headers: map[string]string{"Authorization": "Bearer " + token(map[string]any{"iss": google, "email": "alice@example.com"})},
			email: "alice@example.com", service: "alice@example.com"},
		{name: "X-Serverless-Authorization first", headers: map[string]string{"Authorization": "Basic eDp5",
			"X-Serverless-Authorization": "Bearer " + token(map[string]any{"iss": google, "email": "x@p.iam.gserviceaccount.com"})},
			email: "x@p.iam.gserviceaccount.com", service: "x"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, _ := http.NewRequest("POST", "http://x/", nil)
			for k, v := range c.headers {
				r.Header.Set(k, v)
			}
			got, err := identity.FromCloudRun(r)
			if (err != nil) != c.err || errors.Is(err, identity.ErrNoToken) != c.noToken {
				t.Fatalf("err %v, want error %v (no token %v)", err, c.err, c.noToken)
			}
			if got.Email != c.email || (c.service != "" && got.Service() != c.service) {
				t.Errorf("caller %+v (service %s), want %s / %s", got, got.Service(), c.email, c.service)
			}
		})
	}
}
