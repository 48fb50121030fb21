package ledger

import (
	"fmt"
	"github.com/relaybus/relaybus/internal/ledger/internal/fsdoc"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

// growingIDs are the fields of the high-volume collections whose values
// may grow with time although they are not timestamps: producers' ids
// (UUIDv7, ULIDs, ORD-2024-002), versions, Pub/Sub message ids.
var growingIDs = map[string][]string{
	model.CollectionEvents:       {"eventId", "aggregateId", "version", "parentEventId", "correlationId", "spanId"},
	model.CollectionConsumptions: {"eventId", "messageId"},
}

// spreadLeads are the fields whose values are spread over the key space
// (a hash of the event id, a W3C trace id): an index they lead takes new
// entries all over its range, not at one end.
var spreadLeads = map[string]bool{fsdoc.FieldShard: true, fsdoc.FieldTraceID: true}

// sequentialPaths returns the dotted paths of every field of a document
// type whose values grow with time: every time.Time, however deep (a map's
// keys as "*"), and the type's growingIDs.
func sequentialPaths(collection string, typ reflect.Type) []string {
	out := append([]string(nil), growingIDs[collection]...)
	timeType := reflect.TypeFor[time.Time]()
	var walk func(t reflect.Type, prefix string, depth int)
	walk = func(t reflect.Type, prefix string, depth int) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		switch {
		case t == timeType:
			out = append(out, prefix)
			return
		case t.Kind() == reflect.Map:
			walk(t.Elem(), prefix+".*", depth+1)
			return
		case t.Kind() != reflect.Struct || depth > 4:
			return
		}
		for i := 0; i < t.NumField(); i++ {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("firestore"), ",")
			if name == "" || name == "-" {
				continue
			}
			p := name
			if prefix != "" {
				p = prefix + "." + name
			}
			walk(t.Field(i).Type, p, depth+1)
		}
	}
	walk(typ, "", 0)
	return out
}

// hotspots returns every way the index declaration lets a sequential
// field of the high-volume collections (events, their attempts) hotspot:
// a single-field index (no exemption on the field or a map above it), or a
// composite index that holds it and is not led by a spread field.
func hotspots(f indexFile) []string {
	exempt := map[string]bool{}
	for _, e := range f.Exemptions {
		exempt[e.Collection+"/"+e.Field] = true
	}
	var out []string
	for _, coll := range []string{model.CollectionEvents, model.CollectionConsumptions} {
		seq := map[string]bool{}
		for _, p := range sequentialPaths(coll, docTypes[coll]) {
			seq[p] = true
			covered := false
			parts := strings.Split(p, ".")
			for i := 1; i <= len(parts) && !covered; i++ {
				if parts[i-1] == "*" {
					break // a map's subfield: only an exemption above the map covers every key
				}
				covered = exempt[coll+"/"+strings.Join(parts[:i], ".")]
			}
			if !covered {
				out = append(out, fmt.Sprintf("%s/%s grows with time and keeps its single-field index: exempt it (or a map above it) in indexes.yaml", coll, p))
			}
		}
		for _, c := range f.Composite {
			if c.Collection != coll || len(c.Fields) == 0 || spreadLeads[c.Fields[0].Field] {
				continue
			}
			for _, fl := range c.Fields {
				if seq[fl.Field] {
					out = append(out, fmt.Sprintf("composite index %s %v orders new entries by %s, which grows with time, and is not led by shard", coll, c.Fields, fl.Field))
				}
			}
		}
	}
	return out
}

// No sequential field of the events or their attempts is indexed in a way
// that takes every new entry at one end of one key range: the repository's
// declaration passes, and a declaration with such an index does not.
func TestNoHotspotByConstruction(t *testing.T) {
	f := loadIndexes(t)
	for _, p := range hotspots(f) {
		t.Error(p)
	}
	// The fields the check finds include the nested ones.
	paths := strings.Join(sequentialPaths(model.CollectionEvents, docTypes[model.CollectionEvents]), " ")
	for _, want := range []string{"occurredAt", "checkAt", "deleteAt", "latest.*.consumedAt", "repush.at", "publishFailure.at", "aggregateId"} {
		if !strings.Contains(" "+paths+" ", " "+want+" ") {
			t.Errorf("sequential fields of events %q miss %s", paths, want)
		}
	}

	// Cases that must fail.
	bad := f
	bad.Composite = append(bad.Composite[:len(bad.Composite):len(bad.Composite)], struct {
		Collection string             `yaml:"collection"`
		Fields     []fsdoc.IndexField `yaml:"fields"`
	}{model.CollectionEvents, []fsdoc.IndexField{{Field: fsdoc.FieldStatus, Order: fsdoc.Ascending}, {Field: fsdoc.FieldOccurred, Order: fsdoc.Descending}}})
	if got := hotspots(bad); len(got) != 1 || !strings.Contains(got[0], "not led by shard") {
		t.Errorf("an unsharded (status, occurredAt) index: %q, want it refused", got)
	}
	bad = f
	bad.Exemptions = nil
	for _, e := range f.Exemptions {
		if e.Field != "latest" && e.Field != "deleteAt" {
			bad.Exemptions = append(bad.Exemptions, e)
		}
	}
	got := strings.Join(hotspots(bad), "\n")
	for _, want := range []string{"events/latest.*.consumedAt", "events/deleteAt", "event_consumptions/deleteAt"} {
		if !strings.Contains(got, want+" grows with time") {
			t.Errorf("without the latest and deleteAt exemptions: %q, want %s refused", got, want)
		}
	}
}

// Terraform creates what indexes.yaml declares: it reads the file, makes
// every exemption a google_firestore_field with an empty index_config, and
// gives the TTL field (deleteAt, which Google advises exempting:
// https://cloud.google.com/firestore/docs/ttl) its policy and no index.
func TestTerraformAppliesTheIndexDeclaration(t *testing.T) {
	b, err := os.ReadFile("../../infra/terraform/firestore.tf")
	if err != nil {
		t.Fatal(err)
	}
	tf := string(b)
	block := func(kind, name string) string {
		t.Helper()
		re := regexp.MustCompile(`(?s)resource "` + kind + `" "` + name + `" \{(.*?)\n\}`)
		m := re.FindStringSubmatch(tf)
		if m == nil {
			t.Fatalf("firestore.tf has no resource %s.%s", kind, name)
		}
		return m[1]
	}
	if !strings.Contains(tf, `yamldecode(file("${path.module}/../firestore/indexes.yaml"))`) {
		t.Error("firestore.tf does not read infra/firestore/indexes.yaml")
	}
	if ex := block("google_firestore_field", "exemption"); !strings.Contains(ex, "for_each   = local.index_exemptions") || !strings.Contains(ex, "index_config {}") {
		t.Errorf("the exemptions resource does not clear each declared field's indexes:\n%s", ex)
	}
	if ttl := block("google_firestore_field", "ttl"); !strings.Contains(ttl, "ttl_config {}") || !strings.Contains(ttl, "index_config {}") {
		t.Errorf("the TTL resource does not exempt its field:\n%s", ttl)
	}
	if ix := block("google_firestore_index", "ledger"); !strings.Contains(ix, "for_each    = local.composite_indexes") {
		t.Errorf("the composite indexes are not the declared ones:\n%s", ix)
	}
	// Every TTL collection's deleteAt is declared exempt, so the check
	// above holds of what Terraform applies.
	f := loadIndexes(t)
	exempt := map[string]bool{}
	for _, e := range f.Exemptions {
		exempt[e.Collection+"/"+e.Field] = true
	}
	for _, c := range regexp.MustCompile(`for c in \[([^\]]*)\]`).FindStringSubmatch(tf)[1:] {
		for _, coll := range strings.Split(c, ",") {
			coll = strings.Trim(strings.TrimSpace(coll), `"`)
			if !exempt[coll+"/deleteAt"] {
				t.Errorf("Terraform sets a TTL policy on %s/deleteAt, which indexes.yaml does not exempt", coll)
			}
		}
	}
}
