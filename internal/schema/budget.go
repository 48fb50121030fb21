package schema

import (
	"errors"
	"fmt"

	"github.com/hamba/avro/v2"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Limits bound what checking one payload may cost, whatever its schema. A
// payload's bytes are measured first, then its shape is walked without
// decoding anything (the Avro and protobuf binary encodings against the
// schema, JSON as text); a payload past a limit is refused with the limit
// it broke before a decoder allocates for it. Decoders amplify: an Avro
// array of zero-width items (null, an empty record) costs its count in
// time and memory for a few bytes of payload, a protobuf or JSON list of
// empty messages an allocated message per two or three bytes, a JSON
// Schema's uniqueItems the square of an array's length.
type Limits struct {
	// MaxBytes is the largest payload checked (DefaultMaxBytes).
	MaxBytes int
	// MaxDepth bounds nesting: messages in messages, Avro records, arrays,
	// maps and unions, JSON objects and arrays (DefaultMaxDepth).
	MaxDepth int
	// MaxItems bounds the values a payload holds in all: every protobuf
	// field occurrence and packed element, every Avro record field, array
	// and map item, every JSON value (DefaultMaxItems).
	MaxItems int
}

// The default Limits.
const (
	// DefaultMaxBytes is Pub/Sub's limit on a message's size (10 MB): no
	// larger payload can be delivered.
	DefaultMaxBytes = 10_000_000
	// DefaultMaxDepth is far deeper than any event's payload needs.
	DefaultMaxDepth = 64
	// DefaultMaxItems is 100,000 values, a few MiB decoded.
	DefaultMaxItems = 100_000
)

// DefaultLimits are the limits Load and LoadFrom give every schema.
var DefaultLimits = Limits{MaxBytes: DefaultMaxBytes, MaxDepth: DefaultMaxDepth, MaxItems: DefaultMaxItems}

// orDefault fills the zero fields of l from DefaultLimits.
func (l Limits) orDefault() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = DefaultMaxDepth
	}
	if l.MaxItems <= 0 {
		l.MaxItems = DefaultMaxItems
	}
	return l
}

// budget counts a payload's values and nesting against Limits while its
// shape is walked.
type budget struct {
	l     Limits
	items int
}

// overError is a broken limit; its rule names the limit.
type overError struct{ rule string }

func (e *overError) Error() string { return e.rule }

func (b *budget) item(n int) error {
	b.items += n
	if b.items > b.l.MaxItems {
		return &overError{fmt.Sprintf("holds more than %d values (protobuf fields and elements, Avro fields and items, JSON values): relaybus checks payloads up to that many", b.l.MaxItems)}
	}
	return nil
}

func (b *budget) depth(d int) error {
	if d > b.l.MaxDepth {
		return &overError{fmt.Sprintf("nests deeper than %d levels: relaybus checks payloads up to that depth", b.l.MaxDepth)}
	}
	return nil
}

// checkSize refuses a payload over MaxBytes.
func (l Limits) checkSize(payload []byte) error {
	if len(payload) > l.MaxBytes {
		return &overError{fmt.Sprintf("is %d bytes, over the %d bytes relaybus checks (Pub/Sub's message limit)", len(payload), l.MaxBytes)}
	}
	return nil
}

// ---- JSON (protobuf's JSON mapping, JSON Schema) ----------------------------

// walkJSON counts the values and the nesting of a JSON text without
// decoding it: each value, container or scalar, is one item (an upper
// bound: commas plus containers plus one). Malformed text is left to the
// decoder, which says what is wrong with it.
func walkJSON(payload []byte, l Limits) error {
	if err := l.checkSize(payload); err != nil {
		return err
	}
	b := &budget{l: l}
	depth := 0
	inString, escaped := false, false
	if err := b.item(1); err != nil {
		return err
	}
	for _, c := range payload {
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			depth++
			if err := b.depth(depth); err != nil {
				return err
			}
			if err := b.item(1); err != nil {
				return err
			}
		case '}', ']':
			depth--
		case ',':
			if err := b.item(1); err != nil {
				return err
			}
		}
	}
	return nil
}

// ---- protobuf binary --------------------------------------------------------

// walkProto counts the fields and packed elements of a protobuf binary
// payload of message md, and its nesting, reading tags and lengths only.
// Fields md does not declare are skipped (the decoder keeps them as
// unknown, and validate refuses them); malformed data is left to the
// decoder.
func walkProto(payload []byte, md protoreflect.MessageDescriptor, l Limits) error {
	if err := l.checkSize(payload); err != nil {
		return err
	}
	return (&budget{l: l}).proto(payload, md, 1)
}

func (b *budget) proto(data []byte, md protoreflect.MessageDescriptor, depth int) error {
	if err := b.depth(depth); err != nil {
		return err
	}
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return nil
		}
		data = data[n:]
		if typ == protowire.StartGroupType {
			// Groups nest without a length: count the nesting the decoder
			// would recurse into.
			if err := b.group(data, depth+1); err != nil {
				return err
			}
		}
		m := protowire.ConsumeFieldValue(num, typ, data)
		if m < 0 {
			return nil
		}
		value := data[:m]
		data = data[m:]
		if err := b.item(1); err != nil {
			return err
		}
		fd := md.Fields().ByNumber(num)
		if fd == nil || typ != protowire.BytesType {
			continue
		}
		body, k := protowire.ConsumeBytes(value)
		if k < 0 {
			continue
		}
		switch {
		case fd.Message() != nil:
			if err := b.proto(body, fd.Message(), depth+1); err != nil {
				return err
			}
		case fd.IsList() && fd.Kind() != protoreflect.StringKind && fd.Kind() != protoreflect.BytesKind:
			// A packed repeated scalar: one item per element.
			if err := b.item(packedCount(fd.Kind(), body)); err != nil {
				return err
			}
		}
	}
	return nil
}

// group counts the nesting of a group's fields up to its end tag.
func (b *budget) group(data []byte, depth int) error {
	if err := b.depth(depth); err != nil {
		return err
	}
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 || typ == protowire.EndGroupType {
			return nil
		}
		data = data[n:]
		if typ == protowire.StartGroupType {
			if err := b.group(data, depth+1); err != nil {
				return err
			}
		}
		m := protowire.ConsumeFieldValue(num, typ, data)
		if m < 0 {
			return nil
		}
		data = data[m:]
		if err := b.item(1); err != nil {
			return err
		}
	}
	return nil
}

// packedCount is the number of elements in a packed repeated field.
func packedCount(k protoreflect.Kind, body []byte) int {
	switch k {
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return len(body) / 4
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return len(body) / 8
	}
	n := 0
	for _, c := range body {
		if c < 0x80 {
			n++
		}
	}
	return n
}

// ---- Avro binary ------------------------------------------------------------

// walkAvro walks an Avro binary payload of schema s without decoding it:
// block counts, union branches and lengths are read, values skipped, and
// every record field, array item and map entry counted. An array of items
// that take no bytes is where Avro amplifies (a count costs its items in
// time and memory), so a block's count is checked before any of its items.
// The walk is the judge of the payload's structure: data that ends early
// or breaks (a length past the end, a union branch or enum symbol the
// schema does not have, a varint longer than ten bytes) is refused here,
// since the decoder would allocate for the counts before it.
func walkAvro(payload []byte, s avro.Schema, l Limits) error {
	if err := l.checkSize(payload); err != nil {
		return err
	}
	w := &avroWalk{budget: budget{l: l}, data: payload}
	if err := w.value(s, 1); err != nil {
		if errors.Is(err, errAvroBroken) {
			return &overError{fmt.Sprintf("must be %s in Avro's binary encoding: it ends or breaks at byte %d", avroName(s), len(payload)-len(w.data))}
		}
		return err
	}
	return nil
}

type avroWalk struct {
	budget
	data []byte
}

// errAvroBroken ends a walk over malformed data.
var errAvroBroken = errors.New("avro: malformed")

// long reads a zig-zag varint of at most ten bytes, as the decoder does.
func (w *avroWalk) long() (int64, error) {
	var v uint64
	for i := 0; i < 10 && i < len(w.data); i++ {
		b := w.data[i]
		v |= uint64(b&0x7f) << (7 * i)
		if b < 0x80 {
			w.data = w.data[i+1:]
			return int64(v>>1) ^ -int64(v&1), nil
		}
	}
	return 0, errAvroBroken
}

func (w *avroWalk) skip(n int64) error {
	if n < 0 || n > int64(len(w.data)) {
		return errAvroBroken
	}
	w.data = w.data[n:]
	return nil
}

// value walks one value at depth: records, arrays and maps are levels.
func (w *avroWalk) value(s avro.Schema, depth int) error {
	switch s := s.(type) {
	case *avro.RefSchema:
		return w.value(s.Schema(), depth)
	case *avro.RecordSchema:
		if err := w.depth(depth); err != nil {
			return err
		}
		for _, f := range s.Fields() {
			if err := w.item(1); err != nil {
				return err
			}
			if err := w.value(f.Type(), depth+1); err != nil {
				return err
			}
		}
		return nil
	case *avro.ArraySchema:
		return w.blocks(depth, s.Items())
	case *avro.MapSchema:
		return w.blocks(depth, avro.NewPrimitiveSchema(avro.String, nil), s.Values())
	case *avro.UnionSchema:
		// A union is a choice, not a level: its branch is at its depth.
		i, err := w.long()
		if err != nil {
			return err
		}
		if i < 0 || i >= int64(len(s.Types())) {
			return errAvroBroken
		}
		return w.value(s.Types()[i], depth)
	case *avro.FixedSchema:
		return w.skip(int64(s.Size()))
	case *avro.EnumSchema:
		i, err := w.long()
		if err == nil && (i < 0 || i >= int64(len(s.Symbols()))) {
			err = errAvroBroken
		}
		return err
	}
	switch s.Type() {
	case avro.Null:
		return nil
	case avro.Boolean:
		return w.skip(1)
	case avro.Int, avro.Long:
		_, err := w.long()
		return err
	case avro.Float:
		return w.skip(4)
	case avro.Double:
		return w.skip(8)
	case avro.Bytes, avro.String:
		n, err := w.long()
		if err != nil {
			return err
		}
		return w.skip(n)
	}
	return errAvroBroken
}

// blocks walks an array's or a map's blocks: each a count (negative: its
// absolute value, then the block's size in bytes), then that many items of
// the given schemas (a map entry is a key and a value), until a zero count.
func (w *avroWalk) blocks(depth int, item ...avro.Schema) error {
	if err := w.depth(depth); err != nil {
		return err
	}
	for {
		n, err := w.long()
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if n < 0 {
			n = -n
			if _, err := w.long(); err != nil {
				return err
			}
		}
		if n < 0 || n > int64(w.l.MaxItems) {
			return w.item(w.l.MaxItems + 1)
		}
		if err := w.item(int(n)); err != nil {
			return err
		}
		for ; n > 0; n-- {
			for _, s := range item {
				if err := w.value(s, depth+1); err != nil {
					return err
				}
			}
		}
	}
}
