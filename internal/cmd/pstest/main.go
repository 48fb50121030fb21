// Command pstest runs the Go Pub/Sub fake (cloud.google.com/go/pubsub/v2's
// pstest, served by internal/pstestserver so that Pull long-polls) in a
// process of its own and prints its address on the first line of its
// output, then serves until its standard input closes or it is signalled.
//
// Point the stack at it with PUBSUB_EMULATOR_HOST: its messages then
// outlive the stack (the crash test kills the stack under it), and unlike
// the gcloud emulator it keeps no thread per ordering key. Benchmarks that
// measure their own heap run it beside them, so the fake's store (every
// message it ever received) is not counted as theirs.
//
//	go run ./internal/cmd/pstest [-addr 127.0.0.1:8085]
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/relaybus/relaybus/internal/pstestserver"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "address to serve on (port 0 picks a free one)")
	stdin := flag.Bool("stdin", true, "stop when standard input closes")
	lease := flag.Duration("pull-lease", 10*time.Second, "ack deadline of pulled messages, as if the caller extended it at once (0: the subscription's)")
	flag.Parse()
	srv, err := pstestserver.Start(*addr, pstestserver.Options{PullLease: *lease})
	if err != nil {
		fmt.Fprintln(os.Stderr, "pstest:", err)
		os.Exit(1)
	}
	fmt.Println(srv.Addr)
	done := make(chan struct{})
	if *stdin {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			close(done)
		}()
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	select {
	case <-done:
	case <-sig:
	}
	os.Exit(0) // pstest's Close can hang after heavy use; the process is ending
}
