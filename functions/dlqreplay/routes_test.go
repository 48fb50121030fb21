package dlqreplay

import (
	"go/parser"
	"go/token"
	"regexp"
	"slices"
	"testing"
)

// Every route of the table is listed in the package comment, once, and
// the comment lists no route the table lacks.
func TestRoutesAreDocumented(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "dlqreplay.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	// A route's line: its method, then its path ({name} for an argument).
	line := regexp.MustCompile(`(?m)^\t?(GET|POST|PATCH|DELETE|PUT) +/(\S+)`)
	arg := regexp.MustCompile(`\{[a-zA-Z]*\}`)
	var documented []string
	for _, m := range line.FindAllStringSubmatch(f.Doc.Text(), -1) {
		documented = append(documented, m[1]+" "+arg.ReplaceAllString(m[2], "{}"))
	}
	var table []string
	for _, rt := range routesOf(&server{}, &letters{}, &events{}, &consumerRegistry{}, &deliveryControl{}, &overview{}, &auditView{}, &catalogView{}, &replayJobs{}) {
		table = append(table, rt.method+" "+rt.pattern)
	}
	for _, rt := range backfillRoutes(&backfills{}) {
		table = append(table, rt.method+" "+rt.pattern)
	}
	for _, rt := range forwarderRoutes(&forwarderAPI{}) {
		table = append(table, rt.method+" "+rt.pattern)
	}
	if len(table) == 0 || len(documented) == 0 {
		t.Fatalf("%d routes in the table, %d in the package comment", len(table), len(documented))
	}
	for _, r := range table {
		switch n := count(documented, r); {
		case n == 0:
			t.Errorf("route %s is not in the package comment", r)
		case n > 1:
			t.Errorf("route %s is in the package comment %d times", r, n)
		}
		if n := count(table, r); n > 1 {
			t.Errorf("route %s is in the table %d times", r, n)
		}
	}
	for _, d := range documented {
		if !slices.Contains(table, d) {
			t.Errorf("the package comment lists %s, which the table lacks", d)
		}
	}
}

func count(list []string, s string) int {
	n := 0
	for _, x := range list {
		if x == s {
			n++
		}
	}
	return n
}
