package main

import (
	"context"
	"flag"
	"strings"
)

// The erase command: erasure by data subject (functions/dlqreplay's POST
// /erasures; docs/privacy.md).
func init() {
	commands = append(commands, &command{path: []string{"erase"},
		short: "erase every stored payload of one data subject: outbox rows, ledger, dead letters (admin on every topic)",
		setup: func(fs *flag.FlagSet) runner {
			subject := fs.String("subject", "", "the data subject's id, as the topics' privacy subject field holds it (required)")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args); err != nil {
					return err
				}
				if strings.TrimSpace(*subject) == "" {
					return usageError("give --subject (the data subject's id)")
				}
				return c.do(ctx, "POST", "/erasures", map[string]string{"subject": *subject}, renderKV)
			}
		}})
}
