package infra

import (
	"bytes"
	"encoding/json"
)

// jsonUnmarshal decodes with numbers as json.Number, so 60 and "60" differ.
func jsonUnmarshal(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	return d.Decode(v)
}
