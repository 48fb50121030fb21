// Command pstest runs the Go Pub/Sub fake (cloud.google.com/go/pubsub/v2's
// pstest) in a process of its own and prints its address on the first line
// of its output, then serves until its standard input closes or it is
// signalled. Benchmarks that measure their own heap run it beside them, so
// the fake's store (every message it ever received) is not counted as
// theirs.
//
//	go run ./internal/cmd/pstest
package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"cloud.google.com/go/pubsub/v2/pstest"
)

func main() {
	srv := pstest.NewServer()
	fmt.Println(srv.Addr)
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	select {
	case <-done:
	case <-sig:
	}
	os.Exit(0) // pstest's Close can hang after heavy use; the process is ending
}
