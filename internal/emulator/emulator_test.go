package emulator

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// Starting each emulator for real proves the prerequisites are installed and
// the command lines right; Stop must leave nothing answering.
func TestStartAndStop(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Java emulators")
	}
	for _, kind := range []Kind{Firestore, PubSub} {
		t.Run(string(kind), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			start := time.Now()
			p, err := Start(ctx, kind, Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s emulator ready on %s in %v", kind, p.Host, time.Since(start).Round(time.Millisecond))
			p.Stop()
			if resp, err := http.Get("http://" + p.Host + "/"); err == nil {
				resp.Body.Close()
				t.Fatalf("%s emulator still answering after Stop", kind)
			}
		})
	}
}
