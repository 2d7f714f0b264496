package proxy

import (
	"mime"
	"net/http"
	"strconv"
	"strings"
)

// mediaKind is an encoding the Service view can read and edit.
type mediaKind int

const (
	mediaNone mediaKind = iota
	mediaJSON
	mediaProtobuf
)

const (
	contentTypeJSON     = "application/json"
	contentTypeProtobuf = "application/vnd.kubernetes.protobuf"
)

func (m mediaKind) contentType() string {
	if m == mediaProtobuf {
		return contentTypeProtobuf
	}
	return contentTypeJSON
}

// mediaOf reads a Content-Type header.
func mediaOf(contentType string) mediaKind {
	t, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return mediaNone
	}
	switch t {
	case contentTypeJSON:
		return mediaJSON
	case contentTypeProtobuf:
		return mediaProtobuf
	}
	return mediaNone
}

// acceptClause is one media range of an Accept header.
type acceptClause struct {
	// kind is the plain object encoding the clause asks for: mediaNone for
	// any other form (Table, PartialObjectMetadata, YAML, CBOR, ...).
	kind mediaKind
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
			case contentTypeJSON, "*/*", "application/*":
				c.kind = mediaJSON
			case contentTypeProtobuf:
				c.kind = mediaProtobuf
			}
		}
		out = append(out, c)
	}
	return out
}

// negotiateMedia picks the encoding of a Service response from the client's
// Accept headers: JSON or protobuf, the client's preference by q-value and
// then order; */* and an absent header mean JSON, as at the API server.
// Media types that ask the API server to transform the answer (as=Table,
// as=PartialObjectMetadata, ...) are skipped: the view filters Services, and
// a table or metadata-only answer would not show it what it filters on.
// ok is false when nothing acceptable remains (406).
func negotiateMedia(accept []string) (m mediaKind, ok bool) {
	m, _, ok = bestPlain(accept)
	return m, ok
}

// bestPlain is negotiateMedia with the q-value of the clause it picked.
func bestPlain(accept []string) (m mediaKind, q float64, ok bool) {
	if strings.TrimSpace(strings.Join(accept, ",")) == "" {
		return mediaJSON, 1, true
	}
	best, bestQ := mediaNone, -1.0
	for _, c := range acceptClauses(accept) {
		if c.valid && c.q > 0 && c.kind != mediaNone && c.q > bestQ {
			best, bestQ = c.kind, c.q
		}
	}
	return best, bestQ, best != mediaNone
}

// plainPreferred says whether the API server answers a GET of a Node with
// these Accept headers as a plain object in JSON or protobuf, and in which
// (negotiateMedia's pick): only when that pick's q-value is above that of
// every clause in another form. The API server takes the clauses by q-value,
// then wildcards last, in an order that is not the header's at a tie (its
// sort is not stable), so a tie is another form; so is a header with a
// clause the gate cannot read. Another form is a read the gate holds
// (nodehold.go), which is sound for any form: erring that way costs reads,
// never the view.
func plainPreferred(accept []string) (mediaKind, bool) {
	m, q, ok := bestPlain(accept)
	if !ok {
		return mediaNone, false
	}
	for _, c := range acceptClauses(accept) {
		if !c.valid || (c.kind == mediaNone && c.q >= q) {
			return mediaNone, false
		}
	}
	return m, true
}

// prepareAnswerRequest asks the API server for exactly the encoding the gate
// will read. The gate reads the answer uncompressed: where the client accepts
// gzip, the gate's transport asks for it and unpacks it (the link to the API
// server carries what it would have carried for the client); where it does
// not, the gate does not either.
func prepareAnswerRequest(r *http.Request, media mediaKind) {
	r.Header.Set("Accept", media.contentType())
	if strings.Contains(strings.ToLower(strings.Join(r.Header.Values("Accept-Encoding"), ",")), "gzip") {
		r.Header.Del("Accept-Encoding")
	} else {
		r.Header.Set("Accept-Encoding", "identity")
	}
	r.RequestURI = ""
}
