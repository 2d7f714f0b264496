package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// JSON at the wire level: the end of a value, the members of an object, the
// elements of an array, and a stream of consecutive values. Nothing is
// decoded into objects; service.go finds the few members the view decides on
// and copies everything else byte for byte.

var (
	// errJSONIncomplete: the bytes end inside a value (read more).
	errJSONIncomplete = errors.New("JSON value incomplete")
	// errJSONSyntax: the bytes are not the JSON the view expects.
	errJSONSyntax = errors.New("malformed JSON")
)

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// skipJSONSpace returns the index of the first non-space byte at or after i.
func skipJSONSpace(b []byte, i int) int {
	for i < len(b) && isJSONSpace(b[i]) {
		i++
	}
	return i
}

// jsonValueEnd returns the index just past the JSON value that starts at b[i].
func jsonValueEnd(b []byte, i int) (int, error) {
	if i >= len(b) {
		return len(b), errJSONIncomplete
	}
	switch c := b[i]; c {
	case '"':
		return jsonStringEnd(b, i)
	case '{', '[':
		return jsonCompositeEnd(b, i)
	default:
		return jsonLiteralEnd(b, i)
	}
}

// jsonStringEnd returns the index just past the string that starts at b[i] ('"').
func jsonStringEnd(b []byte, i int) (int, error) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '"':
			return j + 1, nil
		case '\\':
			j++ // the escaped byte, whatever it is
		}
	}
	return len(b), errJSONIncomplete
}

// jsonCompositeEnd returns the index just past the object or array that starts
// at b[i]. It counts brackets outside strings and does not validate.
func jsonCompositeEnd(b []byte, i int) (int, error) {
	depth := 0
	for j := i; j < len(b); j++ {
		switch b[j] {
		case '"':
			// Inlined jsonStringEnd: most of a Service is short strings.
			for j++; j < len(b) && b[j] != '"'; j++ {
				if b[j] == '\\' {
					j++
				}
			}
			if j >= len(b) {
				return len(b), errJSONIncomplete
			}
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return j + 1, nil
			}
			if depth < 0 {
				return j, errJSONSyntax
			}
		}
	}
	return len(b), errJSONIncomplete
}

// jsonLiteralEnd returns the index just past a number, true, false or null.
// A literal that reaches the end of b may continue: incomplete.
func jsonLiteralEnd(b []byte, i int) (int, error) {
	switch c := b[i]; {
	case c == '-' || (c >= '0' && c <= '9') || c == 't' || c == 'f' || c == 'n':
	default:
		return i, errJSONSyntax
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == ',' || c == '}' || c == ']' || isJSONSpace(c):
			return j, nil
		case c == '"' || c == '{' || c == '[' || c == ':':
			return j, errJSONSyntax
		}
	}
	return len(b), errJSONIncomplete
}

// jsonEachMember calls fn for every member of the object that starts at b[i]
// ('{') with the raw key (quotes included) and the start of the value; fn
// returns the end of the value. It returns the index just past the object.
func jsonEachMember(b []byte, i int, fn func(key []byte, keyStart, valueStart int) (int, error)) (int, error) {
	if i >= len(b) {
		return len(b), errJSONIncomplete
	}
	if b[i] != '{' {
		return i, errJSONSyntax
	}
	j := skipJSONSpace(b, i+1)
	if j < len(b) && b[j] == '}' {
		return j + 1, nil
	}
	for {
		if j >= len(b) {
			return len(b), errJSONIncomplete
		}
		if b[j] != '"' {
			return j, errJSONSyntax
		}
		keyEnd, err := jsonStringEnd(b, j)
		if err != nil {
			return keyEnd, err
		}
		k := skipJSONSpace(b, keyEnd)
		if k >= len(b) {
			return len(b), errJSONIncomplete
		}
		if b[k] != ':' {
			return k, errJSONSyntax
		}
		vs := skipJSONSpace(b, k+1)
		if vs >= len(b) {
			return len(b), errJSONIncomplete
		}
		ve, err := fn(b[j:keyEnd], j, vs)
		if err != nil {
			return ve, err
		}
		j = skipJSONSpace(b, ve)
		if j >= len(b) {
			return len(b), errJSONIncomplete
		}
		switch b[j] {
		case ',':
			j = skipJSONSpace(b, j+1)
		case '}':
			return j + 1, nil
		default:
			return j, errJSONSyntax
		}
	}
}

// jsonPlainString returns what a string literal without escapes holds, and
// nil for anything else.
func jsonPlainString(lit []byte) []byte {
	if len(lit) < 2 || lit[0] != '"' || lit[len(lit)-1] != '"' || bytes.IndexByte(lit, '\\') >= 0 {
		return nil
	}
	return lit[1 : len(lit)-1]
}

// jsonStringIs reports whether the JSON string literal lit means s.
func jsonStringIs(lit []byte, s string) bool {
	if len(lit) >= 2 && lit[0] == '"' && bytes.IndexByte(lit, '\\') < 0 {
		return string(lit[1:len(lit)-1]) == s
	}
	u, err := jsonUnquote(lit)
	return err == nil && u == s
}

// jsonMember is one member of an object: b[keyStart:valueEnd] is `"key":value`.
type jsonMember struct {
	// key is the member's name, unescaped.
	key                            string
	keyStart, valueStart, valueEnd int
}

// jsonObjectMembers calls fn for every member of the object that starts at
// b[i] ('{'), in order, and returns the index just past the object.
func jsonObjectMembers(b []byte, i int, fn func(m jsonMember) error) (int, error) {
	return jsonEachMember(b, i, func(raw []byte, keyStart, valueStart int) (int, error) {
		key, err := jsonUnquote(raw)
		if err != nil {
			return keyStart, err
		}
		valueEnd, err := jsonValueEnd(b, valueStart)
		if err != nil {
			return valueEnd, err
		}
		return valueEnd, fn(jsonMember{key: key, keyStart: keyStart, valueStart: valueStart, valueEnd: valueEnd})
	})
}

// jsonArrayElements calls fn for the bounds of every element of the array that
// starts at b[i] ('['), and returns the index just past the array.
func jsonArrayElements(b []byte, i int, fn func(start, end int) error) (int, error) {
	if i >= len(b) {
		return len(b), errJSONIncomplete
	}
	if b[i] != '[' {
		return i, errJSONSyntax
	}
	j := skipJSONSpace(b, i+1)
	if j < len(b) && b[j] == ']' {
		return j + 1, nil
	}
	for {
		end, err := jsonValueEnd(b, j)
		if err != nil {
			return end, err
		}
		if err := fn(j, end); err != nil {
			return end, err
		}
		j = skipJSONSpace(b, end)
		if j >= len(b) {
			return len(b), errJSONIncomplete
		}
		switch b[j] {
		case ',':
			j = skipJSONSpace(b, j+1)
		case ']':
			return j + 1, nil
		default:
			return j, errJSONSyntax
		}
	}
}

// jsonUnquote returns the string a JSON string literal (with its quotes) means.
func jsonUnquote(lit []byte) (string, error) {
	if len(lit) < 2 || lit[0] != '"' || lit[len(lit)-1] != '"' {
		return "", errJSONSyntax
	}
	if bytes.IndexByte(lit, '\\') < 0 {
		return string(lit[1 : len(lit)-1]), nil
	}
	var s string
	if err := json.Unmarshal(lit, &s); err != nil {
		return "", fmt.Errorf("%w: %v", errJSONSyntax, err)
	}
	return s, nil
}

// jsonOptionalString reads a value that is a string or null.
func jsonOptionalString(v []byte) (s string, set bool, err error) {
	if bytes.Equal(v, []byte("null")) {
		return "", false, nil
	}
	if len(v) == 0 || v[0] != '"' {
		return "", false, errJSONSyntax
	}
	s, err = jsonUnquote(v)
	return s, err == nil, err
}

// jsonStream reads consecutive JSON values (and the punctuation between them)
// from a stream, holding at most one value in memory.
type jsonStream struct {
	r   io.Reader
	buf []byte
	// off is the start of the unread bytes in buf.
	off int
	// eof is set once r has ended (err is its error).
	eof bool
	err error
	// max bounds one value.
	max int
}

func newJSONStream(r io.Reader, max int) *jsonStream {
	return &jsonStream{r: r, buf: make([]byte, 0, 64<<10), max: max}
}

// fill reads more bytes; it returns an error at the end of the stream.
func (s *jsonStream) fill() error {
	if s.eof {
		if s.err != nil {
			return s.err
		}
		return io.ErrUnexpectedEOF
	}
	if s.off > 0 {
		n := copy(s.buf, s.buf[s.off:])
		s.buf = s.buf[:n]
		s.off = 0
	}
	if len(s.buf) >= s.max {
		return fmt.Errorf("a JSON value of more than %d bytes", s.max)
	}
	if cap(s.buf)-len(s.buf) < 32<<10 {
		grown := make([]byte, len(s.buf), 2*cap(s.buf)+32<<10)
		copy(grown, s.buf)
		s.buf = grown
	}
	n, err := s.r.Read(s.buf[len(s.buf):cap(s.buf)])
	s.buf = s.buf[:len(s.buf)+n]
	if err != nil {
		s.eof = true
		if !errors.Is(err, io.EOF) {
			s.err = err
		}
	}
	return nil
}

// peek skips spaces and returns the next byte without consuming it; at the
// clean end of the stream it returns io.EOF.
func (s *jsonStream) peek() (byte, error) {
	for {
		s.off = skipJSONSpace(s.buf, s.off)
		if s.off < len(s.buf) {
			return s.buf[s.off], nil
		}
		if s.eof {
			if s.err != nil {
				return 0, s.err
			}
			return 0, io.EOF
		}
		if err := s.fill(); err != nil {
			return 0, err
		}
	}
}

// expect consumes the byte c (after spaces).
func (s *jsonStream) expect(c byte) error {
	got, err := s.peek()
	if err != nil {
		return noEOF(err)
	}
	if got != c {
		return fmt.Errorf("%w: want %q, got %q", errJSONSyntax, c, got)
	}
	s.off++
	return nil
}

// value returns the next complete value (after spaces); the slice is valid
// until the next call.
func (s *jsonStream) value() ([]byte, error) {
	return s.scanValue(func(b []byte) (int, error) { return jsonValueEnd(b, 0) })
}

// scanValue runs scan over the unread bytes, which start with a value (after
// spaces); scan returns the end of the value, or errJSONIncomplete to be run
// again with more bytes. The value's bytes are valid until the next call.
// Reading a value this way reads it once, where value and a scan of what it
// returns read it twice.
func (s *jsonStream) scanValue(scan func(b []byte) (int, error)) ([]byte, error) {
	if _, err := s.peek(); err != nil {
		return nil, noEOF(err)
	}
	for {
		end, err := scan(s.buf[s.off:])
		switch {
		case err == nil:
			v := s.buf[s.off : s.off+end]
			s.off += end
			return v, nil
		case errors.Is(err, errJSONIncomplete):
			if err := s.fill(); err != nil {
				return nil, noEOF(err)
			}
		default:
			return nil, err
		}
	}
}

// end reports whether only spaces are left.
func (s *jsonStream) end() error {
	_, err := s.peek()
	switch {
	case errors.Is(err, io.EOF):
		return nil
	case err != nil:
		return err
	default:
		return fmt.Errorf("%w: data after the end", errJSONSyntax)
	}
}
