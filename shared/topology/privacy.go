package topology

import "github.com/relaybus/relaybus/internal/privacy"

// Privacy is a topic's privacy rule (docs/privacy.md): its personal
// fields, the field naming the data subject, and what each place keeps.
// The zero value declares nothing: every place keeps payloads whole.
type Privacy struct {
	// Fields are the personal fields, as JSON pointers ("*" segments
	// allowed).
	Fields []string `yaml:"fields" json:"fields,omitempty"`
	// Subject is the JSON pointer of the field naming the data subject.
	Subject string `yaml:"subject" json:"subject,omitempty"`
	// Redaction is hash (the default) or remove.
	Redaction string `yaml:"redaction" json:"redaction,omitempty"`
	// Each place's mode: whole, redact or drop (defaults in docs/privacy.md).
	Ledger  string `yaml:"ledger" json:"ledger,omitempty"`
	Console string `yaml:"console" json:"console,omitempty"`
	Archive string `yaml:"archive" json:"archive,omitempty"`
	History string `yaml:"history" json:"history,omitempty"`
	Logs    string `yaml:"logs" json:"logs,omitempty"`
	Traces  string `yaml:"traces" json:"traces,omitempty"`
}

// Declared reports whether the rule says anything.
func (p Privacy) Declared() bool { return p.rule().Declared() }

// rule is the rule internal/privacy applies (internal/privacy/topologyrules
// converts it the same way for the functions).
func (p Privacy) rule() privacy.Rule {
	return privacy.Rule{Fields: p.Fields, Subject: p.Subject, Redaction: p.Redaction,
		LedgerMode: privacy.Mode(p.Ledger), ConsoleMode: privacy.Mode(p.Console), ArchiveMode: privacy.Mode(p.Archive),
		HistoryMode: privacy.Mode(p.History), LogsMode: privacy.Mode(p.Logs), TracesMode: privacy.Mode(p.Traces)}
}
