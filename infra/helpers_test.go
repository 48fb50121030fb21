package infra

import (
	"regexp"
	"sort"
	"strconv"
	"testing"
)

var (
	cloudRunName = regexp.MustCompile(`^[a-z]([-a-z0-9]*[a-z0-9])?$`)
	accountID    = regexp.MustCompile(`^[a-z][-a-z0-9]{4,28}[a-z0-9]$`)
)

func itoa(n int) string { return strconv.Itoa(n) }

func keysOf(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// assertUnique fails when two entries of m share the value of field.
func assertUnique(t *testing.T, m map[string]any, field string) {
	t.Helper()
	seen := map[any]string{}
	for k, v := range m {
		f := v.(map[string]any)[field]
		if other, dup := seen[f]; dup {
			t.Errorf("%s %v is shared by %s and %s", field, f, other, k)
		}
		seen[f] = k
	}
}
