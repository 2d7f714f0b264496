package serviceview

import (
	"mime"
	"strconv"
	"strings"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/wire"
)

// acceptClause is one media range of an Accept header.
type acceptClause struct {
	// kind is the plain object encoding the clause asks for: mediaNone for
	// any other form (Table, PartialObjectMetadata, YAML, CBOR, ...).
	kind wire.Media
	q    float64
	// valid is false for a clause the gate cannot parse, or whose q-value
	// is not one (the API server reads such a clause its own way).
	valid bool
}

// acceptClauses parses Accept headers, clause by clause.
func acceptClauses(accept []string) []acceptClause {
	var out []acceptClause
	for part := range strings.SplitSeq(strings.Join(accept, ","), ",") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		t, params, err := mime.ParseMediaType(part)
		if err != nil {
			out = append(out, acceptClause{})
			continue
		}
		c := acceptClause{q: 1, valid: true}
		if v, set := params["q"]; set {
			if c.q, err = strconv.ParseFloat(v, 64); err != nil || c.q < 0 || c.q > 1 {
				out = append(out, acceptClause{})
				continue
			}
		}
		if params["as"] == "" && params["g"] == "" && params["v"] == "" {
			switch t {
			case wire.ContentTypeJSON, "*/*", "application/*":
				c.kind = wire.MediaJSON
			case wire.ContentTypeProtobuf:
				c.kind = wire.MediaProtobuf
			}
		}
		out = append(out, c)
	}
	return out
}

// NegotiateMedia picks the encoding of a Service response from the client's
// Accept headers: JSON or protobuf, the client's preference by q-value and
// then order; */* and an absent header mean JSON, as at the API server.
// Media types that ask the API server to transform the answer (as=Table,
// as=PartialObjectMetadata, ...) are skipped: the view filters Services, and
// a table or metadata-only answer would not show it what it filters on.
// ok is false when nothing acceptable remains (406).
func NegotiateMedia(accept []string) (m wire.Media, ok bool) {
	m, _, ok = bestPlain(accept)
	return m, ok
}

// bestPlain is NegotiateMedia with the q-value of the clause it picked.
func bestPlain(accept []string) (m wire.Media, q float64, ok bool) {
	if strings.TrimSpace(strings.Join(accept, ",")) == "" {
		return wire.MediaJSON, 1, true
	}
	best, bestQ := wire.MediaNone, -1.0
	for _, c := range acceptClauses(accept) {
		if c.valid && c.q > 0 && c.kind != wire.MediaNone && c.q > bestQ {
			best, bestQ = c.kind, c.q
		}
	}
	return best, bestQ, best != wire.MediaNone
}
