// Command dev runs the whole of relaybus on this machine until Ctrl-C (make
// dev): Postgres, Pub/Sub, Firestore, the five functions on one address,
// the delivery loop and the scheduler. See internal/devstack.
//
//	go run ./internal/cmd/dev [-addr 127.0.0.1:8080]
//
// DATABASE_URL, PUBSUB_EMULATOR_HOST and FIRESTORE_EMULATOR_HOST use
// services that already run instead of starting them; LOG_LEVEL (warn)
// sets how much the functions log.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/relaybus/relaybus/internal/devstack"
	"github.com/relaybus/relaybus/shared/logging"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address the functions listen on")
	state := flag.String("state", ".state", "directory for the throwaway Postgres cluster and dev.json")
	flag.Parse()
	level := os.Getenv("LOG_LEVEL")
	if level == "" {
		level = "warn"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	s, err := devstack.Start(ctx, devstack.Options{
		Addr: *addr, StateDir: *state,
		DatabaseURL: os.Getenv("DATABASE_URL"), PubSubHost: os.Getenv("PUBSUB_EMULATOR_HOST"),
		FirestoreHost: os.Getenv("FIRESTORE_EMULATOR_HOST"),
		Logger:        logging.New(os.Stderr, logging.Options{Level: logging.ParseLevel(level)}),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "make dev:", err)
		os.Exit(1)
	}
	fmt.Printf("relaybus local stack ready in %.1fs\n", time.Since(start).Seconds())
	for _, line := range s.Started {
		fmt.Println("  " + line)
	}
	fmt.Printf(`
Publish a first event:
  curl -s -X POST %s/publish -H 'Content-Type: application/json' \
    -d '{"eventType":"order.purchased","topic":"shop.order.events","aggregateId":"order-1","version":1,"source":"order-service","payload":{"orderId":"order-1","memberId":"m-1","amount":42}}'
Run the purchase scenario:  make demo
Stop:                       Ctrl-C
`, s.Info.URL)
	<-ctx.Done()
	fmt.Println("\nstopping: finishing in-flight work (up to 30s)...")
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.Close(cctx)
	fmt.Println("stopped")
}
