package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// JSON at the wire level: the end of a value, the members of an object, the
// elements of an array, and a stream of consecutive values. Nothing is
// decoded into objects; the Service view (package service) finds the few
// members it decides on and copies everything else byte for byte.

var (
	// errJSONIncomplete: the bytes end inside a value (read more).
	errJSONIncomplete = errors.New("JSON value incomplete")
	// ErrJSONSyntax: the bytes are not the JSON the view expects.
	ErrJSONSyntax = errors.New("malformed JSON")
)

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// SkipJSONSpace returns the index of the first non-space byte at or after i.
func SkipJSONSpace(b []byte, i int) int {
	for i < len(b) && isJSONSpace(b[i]) {
		i++
	}
	return i
}

// JSONValueEnd returns the index just past the JSON value that starts at b[i].
func JSONValueEnd(b []byte, i int) (int, error) {
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
				return j, ErrJSONSyntax
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
		return i, ErrJSONSyntax
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == ',' || c == '}' || c == ']' || isJSONSpace(c):
			return j, nil
		case c == '"' || c == '{' || c == '[' || c == ':':
			return j, ErrJSONSyntax
		}
	}
	return len(b), errJSONIncomplete
}

// JSONEachMember calls fn for every member of the object that starts at b[i]
// ('{') with the raw key (quotes included) and the start of the value; fn
// returns the end of the value. It returns the index just past the object.
func JSONEachMember(b []byte, i int, fn func(key []byte, keyStart, valueStart int) (int, error)) (int, error) {
	if i >= len(b) {
		return len(b), errJSONIncomplete
	}
	if b[i] != '{' {
		return i, ErrJSONSyntax
	}
	j := SkipJSONSpace(b, i+1)
	if j < len(b) && b[j] == '}' {
		return j + 1, nil
	}
	for {
		if j >= len(b) {
			return len(b), errJSONIncomplete
		}
		if b[j] != '"' {
			return j, ErrJSONSyntax
		}
		keyEnd, err := jsonStringEnd(b, j)
		if err != nil {
			return keyEnd, err
		}
		k := SkipJSONSpace(b, keyEnd)
		if k >= len(b) {
			return len(b), errJSONIncomplete
		}
		if b[k] != ':' {
			return k, ErrJSONSyntax
		}
		vs := SkipJSONSpace(b, k+1)
		if vs >= len(b) {
			return len(b), errJSONIncomplete
		}
		ve, err := fn(b[j:keyEnd], j, vs)
		if err != nil {
			return ve, err
		}
		j = SkipJSONSpace(b, ve)
		if j >= len(b) {
			return len(b), errJSONIncomplete
		}
		switch b[j] {
		case ',':
			j = SkipJSONSpace(b, j+1)
		case '}':
			return j + 1, nil
		default:
			return j, ErrJSONSyntax
		}
	}
}

// JSONPlainString returns what a string literal without escapes holds, and
// nil for anything else.
func JSONPlainString(lit []byte) []byte {
	if len(lit) < 2 || lit[0] != '"' || lit[len(lit)-1] != '"' || bytes.IndexByte(lit, '\\') >= 0 {
		return nil
	}
	return lit[1 : len(lit)-1]
}

// JSONStringIs reports whether the JSON string literal lit means s.
func JSONStringIs(lit []byte, s string) bool {
	if len(lit) >= 2 && lit[0] == '"' && bytes.IndexByte(lit, '\\') < 0 {
		return string(lit[1:len(lit)-1]) == s
	}
	u, err := JSONUnquote(lit)
	return err == nil && u == s
}

// JSONMember is one member of an object: b[keyStart:valueEnd] is `"key":value`.
type JSONMember struct {
	// key is the member's name, unescaped.
	Key                            string
	KeyStart, ValueStart, ValueEnd int
}

// JSONObjectMembers calls fn for every member of the object that starts at
// b[i] ('{'), in order, and returns the index just past the object.
func JSONObjectMembers(b []byte, i int, fn func(m JSONMember) error) (int, error) {
	return JSONEachMember(b, i, func(raw []byte, keyStart, valueStart int) (int, error) {
		key, err := JSONUnquote(raw)
		if err != nil {
			return keyStart, err
		}
		valueEnd, err := JSONValueEnd(b, valueStart)
		if err != nil {
			return valueEnd, err
		}
		return valueEnd, fn(JSONMember{Key: key, KeyStart: keyStart, ValueStart: valueStart, ValueEnd: valueEnd})
	})
}

// JSONArrayElements calls fn for the bounds of every element of the array that
// starts at b[i] ('['), and returns the index just past the array.
func JSONArrayElements(b []byte, i int, fn func(start, end int) error) (int, error) {
	if i >= len(b) {
		return len(b), errJSONIncomplete
	}
	if b[i] != '[' {
		return i, ErrJSONSyntax
	}
	j := SkipJSONSpace(b, i+1)
	if j < len(b) && b[j] == ']' {
		return j + 1, nil
	}
	for {
		end, err := JSONValueEnd(b, j)
		if err != nil {
			return end, err
		}
		if err := fn(j, end); err != nil {
			return end, err
		}
		j = SkipJSONSpace(b, end)
		if j >= len(b) {
			return len(b), errJSONIncomplete
		}
		switch b[j] {
		case ',':
			j = SkipJSONSpace(b, j+1)
		case ']':
			return j + 1, nil
		default:
			return j, ErrJSONSyntax
		}
	}
}

// JSONUnquote returns the string a JSON string literal (with its quotes) means.
func JSONUnquote(lit []byte) (string, error) {
	if len(lit) < 2 || lit[0] != '"' || lit[len(lit)-1] != '"' {
		return "", ErrJSONSyntax
	}
	if bytes.IndexByte(lit, '\\') < 0 {
		return string(lit[1 : len(lit)-1]), nil
	}
	var s string
	if err := json.Unmarshal(lit, &s); err != nil {
		return "", fmt.Errorf("%w: %v", ErrJSONSyntax, err)
	}
	return s, nil
}

// JSONOptionalString reads a value that is a string or null.
func JSONOptionalString(v []byte) (s string, set bool, err error) {
	if bytes.Equal(v, []byte("null")) {
		return "", false, nil
	}
	if len(v) == 0 || v[0] != '"' {
		return "", false, ErrJSONSyntax
	}
	s, err = JSONUnquote(v)
	return s, err == nil, err
}

// JSONStream reads consecutive JSON values (and the punctuation between them)
// from a stream, holding at most one value in memory.
type JSONStream struct {
	r   io.Reader
	buf []byte
	// off is the start of the unread bytes in buf.
	Off int
	// eof is set once r has ended (err is its error).
	eof bool
	err error
	// max bounds one value.
	max int
}

func NewJSONStream(r io.Reader, max int) *JSONStream {
	return &JSONStream{r: r, buf: make([]byte, 0, 64<<10), max: max}
}

// fill reads more bytes; it returns an error at the end of the stream.
func (s *JSONStream) fill() error {
	if s.eof {
		if s.err != nil {
			return s.err
		}
		return io.ErrUnexpectedEOF
	}
	if s.Off > 0 {
		n := copy(s.buf, s.buf[s.Off:])
		s.buf = s.buf[:n]
		s.Off = 0
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

// Peek skips spaces and returns the next byte without consuming it; at the
// clean end of the stream it returns io.EOF.
func (s *JSONStream) Peek() (byte, error) {
	for {
		s.Off = SkipJSONSpace(s.buf, s.Off)
		if s.Off < len(s.buf) {
			return s.buf[s.Off], nil
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

// Expect consumes the byte c (after spaces).
func (s *JSONStream) Expect(c byte) error {
	got, err := s.Peek()
	if err != nil {
		return NoEOF(err)
	}
	if got != c {
		return fmt.Errorf("%w: want %q, got %q", ErrJSONSyntax, c, got)
	}
	s.Off++
	return nil
}

// Value returns the next complete value (after spaces); the slice is valid
// until the next call.
func (s *JSONStream) Value() ([]byte, error) {
	return s.ScanValue(func(b []byte) (int, error) { return JSONValueEnd(b, 0) })
}

// ScanValue runs scan over the unread bytes, which start with a value (after
// spaces); scan returns the end of the value, or errJSONIncomplete to be run
// again with more bytes. The value's bytes are valid until the next call.
// Reading a value this way reads it once, where value and a scan of what it
// returns read it twice.
func (s *JSONStream) ScanValue(scan func(b []byte) (int, error)) ([]byte, error) {
	if _, err := s.Peek(); err != nil {
		return nil, NoEOF(err)
	}
	for {
		end, err := scan(s.buf[s.Off:])
		switch {
		case err == nil:
			v := s.buf[s.Off : s.Off+end]
			s.Off += end
			return v, nil
		case errors.Is(err, errJSONIncomplete):
			if err := s.fill(); err != nil {
				return nil, NoEOF(err)
			}
		default:
			return nil, err
		}
	}
}

// End reports whether only spaces are left.
func (s *JSONStream) End() error {
	_, err := s.Peek()
	switch {
	case errors.Is(err, io.EOF):
		return nil
	case err != nil:
		return err
	default:
		return fmt.Errorf("%w: data after the end", ErrJSONSyntax)
	}
}
