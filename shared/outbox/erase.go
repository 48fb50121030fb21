package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/relaybus/relaybus/shared/postgres"
)

var eraseSubjectSQL = query("erase_subject")

// ErasedPayload is the payload an erased outbox row holds: JSON null.
const ErasedPayload = "null"

// EraseSubject makes unreadable the payload of every row of topic still in
// the outbox whose JSON payload names subject at path (the segments of a
// JSON pointer: ["customer", "id"] for /customer/id): the payload becomes
// JSON null (ErasedPayload). The rows stay, so no version of an aggregate
// goes missing: a row not yet published is published with the null
// payload, which is what its consumers see. Payloads that are not JSON
// are not searched. It returns how many rows it changed; running it again
// changes none.
//
// Cost: one statement that reads every row of the topic still retained.
func EraseSubject(ctx context.Context, db postgres.DBTX, topic string, path []string, subject string) (int, error) {
	if topic == "" || len(path) == 0 || subject == "" {
		return 0, errors.New("outbox: erase subject: topic, path and subject are required")
	}
	var n int
	if err := db.QueryRow(ctx, eraseSubjectSQL, topic, path, subject).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: erase subject of %s: %w", topic, err)
	}
	return n, nil
}
