package wire

import (
	"errors"
	"io"
)

// Span is a byte range [start, end).
type Span struct{ Start, End int }

// Edit replaces the bytes [start, end) of a buffer by with.
type Edit struct {
	Start, End int
	With       []byte
}

// EditedLen is the length of b after edits (sorted, not overlapping).
func EditedLen(b []byte, edits []Edit) int {
	n := len(b)
	for _, e := range edits {
		n += len(e.With) - (e.End - e.Start)
	}
	return n
}

// AppendEdited appends b with edits applied to dst.
func AppendEdited(dst, b []byte, edits []Edit) []byte {
	at := 0
	for _, e := range edits {
		dst = append(append(dst, b[at:e.Start]...), e.With...)
		at = e.End
	}
	return append(dst, b[at:]...)
}

// WriteEdited writes b with edits applied.
func WriteEdited(w io.Writer, b []byte, edits []Edit) error {
	at := 0
	for _, e := range edits {
		if _, err := w.Write(b[at:e.Start]); err != nil {
			return err
		}
		if _, err := w.Write(e.With); err != nil {
			return err
		}
		at = e.End
	}
	_, err := w.Write(b[at:])
	return err
}

// Interned returns the one of common that raw holds (a string without
// allocating one per object); ok is false for anything else, and for nil.
func Interned(raw []byte, common ...string) (s string, ok bool) {
	if raw == nil {
		return "", false
	}
	for _, c := range common {
		if c != "" && string(raw) == c {
			return c, true
		}
	}
	return "", false
}

// NoEOF turns the end of a stream inside a value into io.ErrUnexpectedEOF.
func NoEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
