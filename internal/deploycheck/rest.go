package deploycheck

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// REST answers Cloud with Google's REST APIs: Service Usage, Cloud Resource
// Manager and Cloud Storage. Client must add credentials (the CLI passes
// golang.org/x/oauth2/google's DefaultClient); the endpoints default to
// Google's and a test points them at a fake server.
type REST struct {
	Client *http.Client
	// ServiceUsage, ResourceManager and Storage are the APIs' base URLs
	// (https://serviceusage.googleapis.com, https://cloudresourcemanager.googleapis.com,
	// https://storage.googleapis.com when empty).
	ServiceUsage, ResourceManager, Storage string
}

func (r REST) base(v, def string) string {
	if v == "" {
		return def
	}
	return strings.TrimSuffix(v, "/")
}

// do sends a request and decodes a JSON answer into out; it returns the
// HTTP status, and an error for anything but 2xx and the statuses in ok.
func (r REST) do(ctx context.Context, method, u string, body any, out any, ok ...int) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	c := r.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	for _, s := range ok {
		if resp.StatusCode == s {
			return s, nil
		}
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		_ = json.Unmarshal(raw, &e)
		return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, u, resp.StatusCode, e.Error.Message)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s: %w", method, u, err)
		}
	}
	return resp.StatusCode, nil
}

// ServiceEnabled implements Cloud with services.get
// (https://cloud.google.com/service-usage/docs/reference/rest/v1/services/get).
func (r REST) ServiceEnabled(ctx context.Context, project, service string) (bool, error) {
	var s struct {
		State string `json:"state"`
	}
	u := fmt.Sprintf("%s/v1/projects/%s/services/%s", r.base(r.ServiceUsage, "https://serviceusage.googleapis.com"), url.PathEscape(project), url.PathEscape(service))
	if _, err := r.do(ctx, http.MethodGet, u, nil, &s); err != nil {
		return false, err
	}
	return s.State == "ENABLED", nil
}

// ProjectRoles implements Cloud with projects.getIamPolicy
// (https://cloud.google.com/resource-manager/reference/rest/v1/projects/getIamPolicy):
// every role of a binding that names member (conditional ones included).
func (r REST) ProjectRoles(ctx context.Context, project, member string) ([]string, error) {
	var p struct {
		Bindings []struct {
			Role    string   `json:"role"`
			Members []string `json:"members"`
		} `json:"bindings"`
	}
	u := fmt.Sprintf("%s/v1/projects/%s:getIamPolicy", r.base(r.ResourceManager, "https://cloudresourcemanager.googleapis.com"), url.PathEscape(project))
	body := map[string]any{"options": map[string]any{"requestedPolicyVersion": 3}}
	if _, err := r.do(ctx, http.MethodPost, u, body, &p); err != nil {
		return nil, err
	}
	var out []string
	for _, b := range p.Bindings {
		for _, m := range b.Members {
			if m == member {
				out = append(out, b.Role)
			}
		}
	}
	return out, nil
}

// Bucket implements Cloud with buckets.get
// (https://cloud.google.com/storage/docs/json_api/v1/buckets/get); 404
// and 403 (the caller may not read it) count as missing.
func (r REST) Bucket(ctx context.Context, name string) (bool, bool, error) {
	var b struct {
		Versioning struct {
			Enabled bool `json:"enabled"`
		} `json:"versioning"`
	}
	u := fmt.Sprintf("%s/storage/v1/b/%s", r.base(r.Storage, "https://storage.googleapis.com"), url.PathEscape(name))
	status, err := r.do(ctx, http.MethodGet, u, nil, &b, http.StatusNotFound, http.StatusForbidden)
	if err != nil {
		return false, false, err
	}
	if status == http.StatusNotFound || status == http.StatusForbidden {
		return false, false, nil
	}
	return true, b.Versioning.Enabled, nil
}
