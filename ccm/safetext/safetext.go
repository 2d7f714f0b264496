// Package safetext makes text others wrote (a node's gRPC error, an event's
// message, an annotation) safe to put into an event, a log line or a
// terminal: one line, nothing a terminal acts on, bounded. talos-ccm uses it
// for what a node's Talos API answers, hybridctl doctor for what it prints.
package safetext

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Line is s without what a terminal or a log reader would act on: control
// characters (line breaks and escapes among them), the Unicode line and
// paragraph separators, bidirectional overrides, and invalid UTF-8.
func Line(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) || r == '\u2028' || r == '\u2029' || r == utf8.RuneError {
			return -1
		}
		return r
	}, s)
}

// Clip is Line(s) cut to at most n bytes at a rune boundary, "…" marking a
// cut.
func Clip(s string, n int) string {
	s = Line(s)
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
