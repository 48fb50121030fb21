// Package model is the ledger's model without its store: the statuses and
// the truth table that derives them from an event's facts (Derive), the
// documents' types (Event, Attempt, Sent), the attempt outcomes, the
// per-topic ledger levels, the rollup notices and the document ids.
//
// It imports no Firestore client, so the engines that feed the ledger (the
// relay's and the consumer's) take their types from here and declare the
// interface they record through; a binary built with the ledger off links
// no Firestore. The store that writes and reads these documents is
// internal/ledger.
package model
