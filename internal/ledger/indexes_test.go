package ledger

import (
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/ledger/internal/fsdoc"
	"github.com/relaybus/relaybus/internal/ledger/model"

	"gopkg.in/yaml.v3"
)

// indexFile is infra/firestore/indexes.yaml.
type indexFile struct {
	Composite []struct {
		Collection string             `yaml:"collection"`
		Fields     []fsdoc.IndexField `yaml:"fields"`
	} `yaml:"composite"`
	Exemptions []struct {
		Collection string `yaml:"collection"`
		Field      string `yaml:"field"`
	} `yaml:"exemptions"`
}

func loadIndexes(t *testing.T) indexFile {
	t.Helper()
	b, err := os.ReadFile("../../infra/firestore/indexes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f indexFile
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("indexes.yaml: %v", err)
	}
	return f
}

// serves reports whether a declared composite index serves a shape: the
// shape's equality fields, in any order, then its ordering fields exactly.
func serves(collection string, fields []fsdoc.IndexField, q fsdoc.QueryShape) bool {
	if collection != q.Collection || len(fields) != len(q.Equality)+len(q.OrderBy) {
		return false
	}
	eq := map[string]bool{}
	for _, f := range q.Equality {
		eq[f] = true
	}
	for i, f := range fields {
		if i < len(q.Equality) {
			if !eq[f.Field] {
				return false
			}
			delete(eq, f.Field)
			continue
		}
		if f != q.OrderBy[i-len(q.Equality)] {
			return false
		}
	}
	return len(eq) == 0
}

// docTypes maps collections to the Go type of their documents.
var docTypes = map[string]reflect.Type{
	model.CollectionEvents:       reflect.TypeFor[model.Event](),
	model.CollectionConsumptions: reflect.TypeFor[model.Attempt](),
	model.CollectionConsumers:    reflect.TypeFor[consumers.ConsumerEntry](),
	audit.Collection:             reflect.TypeFor[audit.Entry](),
}

// fieldType resolves a dotted field path in a document type (nil when the
// type has no such field).
func fieldType(t reflect.Type, path string) reflect.Type {
	for _, part := range strings.Split(path, ".") {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return nil
		}
		var next reflect.Type
		for i := 0; i < t.NumField(); i++ {
			if name, _, _ := strings.Cut(t.Field(i).Tag.Get("firestore"), ","); name == part {
				next = t.Field(i).Type
			}
		}
		if next == nil {
			return nil
		}
		t = next
	}
	return t
}

func TestIndexesDeclared(t *testing.T) {
	f := loadIndexes(t)
	exempt := map[string]bool{}
	for _, e := range f.Exemptions {
		exempt[e.Collection+"/"+e.Field] = true
		if e.Collection == model.CollectionDeadLetters {
			continue // internal/archive's documents; its own test checks them
		}
		if fieldType(docTypes[e.Collection], e.Field) == nil {
			t.Errorf("exemption %s/%s: no such field in the %s documents", e.Collection, e.Field, e.Collection)
		}
	}
	used := make([]bool, len(f.Composite))
	for _, q := range fsdoc.QueryShapes() {
		for _, field := range q.Fields() {
			if field != fsdoc.NameField && fieldType(docTypes[q.Collection], field) == nil {
				t.Errorf("shape %s: no field %s in the %s documents", q.Name, field, q.Collection)
			}
		}
		if !q.NeedsComposite() {
			// Served by single-field indexes, which an exemption removes.
			for _, field := range q.Fields() {
				for p := field; p != ""; p, _, _ = cutLast(p) {
					if exempt[q.Collection+"/"+p] {
						t.Errorf("shape %s needs the single-field index of %s, but indexes.yaml exempts %s", q.Name, field, p)
					}
				}
			}
			continue
		}
		found := false
		for i, c := range f.Composite {
			if serves(c.Collection, c.Fields, q) {
				found, used[i] = true, true
			}
		}
		if !found {
			t.Errorf("shape %s (%s) needs a composite index %s %v; indexes.yaml declares none", q.Name, q.Collection, q.Collection, q.Index())
		}
	}
	for i, c := range f.Composite {
		if !used[i] {
			t.Errorf("composite index %s %v serves no query shape (it only slows writes)", c.Collection, c.Fields)
		}
		for _, fl := range c.Fields {
			if fl.Order != fsdoc.Ascending && fl.Order != fsdoc.Descending {
				t.Errorf("composite index %s %v: order %q", c.Collection, c.Fields, fl.Order)
			}
			if fieldType(docTypes[c.Collection], fl.Field) == nil {
				t.Errorf("composite index %s: no field %s in the documents", c.Collection, fl.Field)
			}
		}
	}
}

// cutLast drops the last segment of a dotted path.
func cutLast(p string) (string, string, bool) {
	i := strings.LastIndexByte(p, '.')
	if i < 0 {
		return "", p, false
	}
	return p[:i], p[i+1:], true
}

// Every timestamp field is exempt from single-field indexing: its values
// grow with time, and an index on them caps writes to the collection.
func TestTimestampsExempt(t *testing.T) {
	f := loadIndexes(t)
	exempt := map[string]bool{}
	for _, e := range f.Exemptions {
		exempt[e.Collection+"/"+e.Field] = true
	}
	timeType := reflect.TypeFor[time.Time]()
	for _, coll := range []string{model.CollectionEvents, model.CollectionConsumptions} {
		typ := docTypes[coll]
		var missing []string
		for i := 0; i < typ.NumField(); i++ {
			name, _, _ := strings.Cut(typ.Field(i).Tag.Get("firestore"), ",")
			if typ.Field(i).Type == timeType && !exempt[coll+"/"+name] {
				missing = append(missing, name)
			}
		}
		sort.Strings(missing)
		if len(missing) > 0 {
			t.Errorf("%s: timestamp fields not exempt from single-field indexes: %v", coll, missing)
		}
	}
}

// The checker itself: a shape without its index, or an exempted field a
// single-field query needs, is caught.
func TestIndexCheckerCatchesMistakes(t *testing.T) {
	q := fsdoc.ListShape([]string{fsdoc.FieldStatus})
	ok := []fsdoc.IndexField{{Field: fsdoc.FieldShard, Order: fsdoc.Ascending}, {Field: fsdoc.FieldStatus, Order: fsdoc.Ascending}, {Field: fsdoc.FieldOccurred, Order: fsdoc.Descending}}
	if !serves(model.CollectionEvents, ok, q) {
		t.Fatal("exact index not accepted")
	}
	swapped := []fsdoc.IndexField{{Field: fsdoc.FieldStatus, Order: fsdoc.Ascending}, {Field: fsdoc.FieldShard, Order: fsdoc.Ascending}, {Field: fsdoc.FieldOccurred, Order: fsdoc.Descending}}
	if !serves(model.CollectionEvents, swapped, q) {
		t.Error("equality fields in another order not accepted")
	}
	for _, bad := range [][]fsdoc.IndexField{
		{{Field: fsdoc.FieldShard, Order: fsdoc.Ascending}, {Field: fsdoc.FieldOccurred, Order: fsdoc.Descending}},
		{{Field: fsdoc.FieldShard, Order: fsdoc.Ascending}, {Field: fsdoc.FieldStatus, Order: fsdoc.Ascending}, {Field: fsdoc.FieldOccurred, Order: fsdoc.Ascending}},
		{{Field: fsdoc.FieldShard, Order: fsdoc.Ascending}, {Field: fsdoc.FieldStatus, Order: fsdoc.Ascending}, {Field: fsdoc.FieldTopic, Order: fsdoc.Ascending}, {Field: fsdoc.FieldOccurred, Order: fsdoc.Descending}},
	} {
		if serves(model.CollectionEvents, bad, q) {
			t.Errorf("index %v accepted for %s", bad, q.Name)
		}
	}
	if serves(model.CollectionConsumptions, ok, q) {
		t.Error("index on another collection accepted")
	}
	if !fsdoc.ListShape(nil).NeedsComposite() || fsdoc.ShapeConsumersByTopic.NeedsComposite() || fsdoc.ShapeAttemptsOfEvent.NeedsComposite() || fsdoc.ShapeEventByName.NeedsComposite() {
		t.Error("NeedsComposite misjudges a shape")
	}
	if fieldType(docTypes[model.CollectionEvents], "initiator.service") == nil || fieldType(docTypes[model.CollectionEvents], "initiator.nope") != nil {
		t.Error("fieldType misresolves paths")
	}
}
