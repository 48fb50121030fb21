// Package ledger is relaybus's event ledger on Firestore: every event with its
// envelope, sender and expected consumers (collection events), the consumers
// registered per topic (topic_consumers), every consumption attempt
// (event_consumptions, insert-only), and archived dead letters.
//
// This file set is being built; types.go holds the vocabulary the relay,
// consume, rollup and dlqreplay functions share: statuses, attempt outcomes,
// document ids and the rollup notice.
package ledger
