package proxy

import (
	"errors"
	"io"
)

// The wire layer: bytes of the API server's JSON and protobuf, read and cut
// without decoding them into objects (wirejson.go, wireproto.go). It knows
// nothing of Services; service.go reads a Service with it.

// span is a byte range [start, end).
type span struct{ start, end int }

// edit replaces the bytes [start, end) of a buffer by with.
type edit struct {
	start, end int
	with       []byte
}

// editedLen is the length of b after edits (sorted, not overlapping).
func editedLen(b []byte, edits []edit) int {
	n := len(b)
	for _, e := range edits {
		n += len(e.with) - (e.end - e.start)
	}
	return n
}

// appendEdited appends b with edits applied to dst.
func appendEdited(dst, b []byte, edits []edit) []byte {
	at := 0
	for _, e := range edits {
		dst = append(append(dst, b[at:e.start]...), e.with...)
		at = e.end
	}
	return append(dst, b[at:]...)
}

// writeEdited writes b with edits applied.
func writeEdited(w io.Writer, b []byte, edits []edit) error {
	at := 0
	for _, e := range edits {
		if _, err := w.Write(b[at:e.start]); err != nil {
			return err
		}
		if _, err := w.Write(e.with); err != nil {
			return err
		}
		at = e.end
	}
	_, err := w.Write(b[at:])
	return err
}

// interned returns the one of common that raw holds (a string without
// allocating one per object); ok is false for anything else, and for nil.
func interned(raw []byte, common ...string) (s string, ok bool) {
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

// noEOF turns the end of a stream inside a value into io.ErrUnexpectedEOF.
func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
