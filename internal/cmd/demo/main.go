// Command demo runs the purchase scenario (internal/devstack.Demo) against
// the stack `make dev` runs; when none is running it starts one in this
// process for the demo's length, from the environment as make dev reads it,
// and says so. It exits 0 only if the
// ledger, projections and inboxes end exactly as expected.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/relaybus/relaybus/internal/devstack"
)

func main() {
	state := flag.String("state", ".state", "the running stack's state directory")
	flag.Parse()
	ctx := context.Background()
	info, err := devstack.ReadInfo(*state)
	if err == nil {
		if resp, herr := http.Get(info.URL + "/publish"); herr == nil {
			resp.Body.Close()
		} else {
			err = herr
		}
	}
	if err != nil {
		fmt.Println("demo: no stack answers; starting one in this process for the demo (make dev runs one that stays)")
		// The environment as make dev reads it (devstack.LoadConfig).
		cfg, serr := devstack.LoadConfig(ctx)
		if serr != nil {
			fmt.Fprintln(os.Stderr, "demo:", serr)
			os.Exit(2)
		}
		o := cfg.Options()
		o.Addr, o.StateDir = "127.0.0.1:0", *state+"/demo"
		s, serr := devstack.Start(ctx, o)
		if serr != nil {
			fmt.Fprintln(os.Stderr, "demo:", serr)
			os.Exit(1)
		}
		defer func() {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			s.Close(cctx)
		}()
		info = s.Info
	} else {
		fmt.Println("demo: against the stack at", info.URL)
	}
	if err := devstack.Demo(ctx, info, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo: FAILED:", err)
		os.Exit(1)
	}
}
