package dlqreplay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/topology"
)

// seekRecorder answers Seek itself and keeps the requests: the Pub/Sub
// emulator answers Unimplemented and pstest's Seek crashes its delivery, so
// what can be checked here is the exact request the API sends Pub/Sub.
type seekRecorder struct {
	mu     sync.Mutex
	reqs   []*pb.SeekRequest
	refuse error // answered instead of success, when set
}

func (s *seekRecorder) React(req any) (bool, any, error) {
	s.mu.Lock()
	if s.refuse != nil {
		defer s.mu.Unlock()
		return true, nil, s.refuse
	}
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, req.(*pb.SeekRequest))
	return true, &pb.SeekResponse{}, nil
}

func TestSeekSendsPubSubTheRewind(t *testing.T) {
	ctx := context.Background()
	emutest.Host(t, emulator.Firestore)
	rec := &seekRecorder{}
	fake := pubsubtest.New(t, pstest.ServerReactorOption{FuncName: "Seek", Reactor: rec})
	top, _ := topology.Load("")
	fake.Provision(t, top)
	store, err := ledger.Open(ctx, ledger.Config{ProjectID: emutest.FirestoreProject(t)}, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	h, err := dlqreplay.New(dlqreplay.Options{Archive: archive.New(store.Client()), Ledger: store, DB: pgtest.Schema(t),
		Publisher: fake.Client, Auth: dlqreplay.AuthNone, Writers: []string{dlqreplay.Anonymous},
		Broker: fake.Client})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	post := func(path string, body any) int {
		b, _ := json.Marshal(body)
		resp, err := http.Post(srv.URL+path, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			var e map[string]string
			_ = json.NewDecoder(resp.Body).Decode(&e)
			t.Logf("%s: %d %v", path, resp.StatusCode, e)
		}
		return resp.StatusCode
	}
	sub := "member.points.events.audit-service-recorder"
	at := time.Date(2026, 11, 20, 8, 0, 0, 0, time.UTC)
	if code := post("/subscriptions/"+sub+":seek", map[string]string{"time": at.Format(time.RFC3339)}); code != 200 {
		t.Fatalf("seek to a time: %d", code)
	}
	// (Seeking to a snapshot cannot be exercised here: pstest refuses the
	// snapshot target before any reactor sees it.)
	for _, bad := range []map[string]string{{}, {"time": "yesterday"}, {"time": at.Format(time.RFC3339), "snapshot": "x"}} {
		if code := post("/subscriptions/"+sub+":seek", bad); code != 400 {
			t.Errorf("seek %v: %d, want 400", bad, code)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.reqs) != 1 {
		t.Fatalf("Pub/Sub got %d seek requests, want 1 (the invalid ones must not reach it)", len(rec.reqs))
	}
	full := "projects/" + pubsubtest.Project + "/subscriptions/" + sub
	if r := rec.reqs[0]; r.Subscription != full || !r.GetTime().AsTime().Equal(at) {
		t.Errorf("seek to time sent %v", r)
	}

	// A seek Pub/Sub refuses is the caller's to change: 409 with
	// Pub/Sub's reason, which says what would be accepted.
	const reason = "cannot seek back: a time after 2026-11-20T08:00:01Z is accepted"
	rec.refuse = status.Error(codes.FailedPrecondition, reason)
	rec.mu.Unlock()
	b, _ := json.Marshal(map[string]string{"time": at.Format(time.RFC3339)})
	resp, err := http.Post(srv.URL+"/subscriptions/"+sub+":seek", "application/json", bytes.NewReader(b))
	rec.mu.Lock()
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e map[string]string
	_ = json.NewDecoder(resp.Body).Decode(&e)
	if resp.StatusCode != http.StatusConflict || e["code"] != "refused" || !strings.Contains(e["message"], reason) {
		t.Errorf("a refused seek: %d %v, want 409 refused with Pub/Sub's reason", resp.StatusCode, e)
	}
}
