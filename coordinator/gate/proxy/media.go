package proxy

import (
	"mime"
	"net/http"
	"slices"
	"sort"
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

// negotiateMedia picks the encoding of a Service response from the client's
// Accept headers: JSON or protobuf, the client's preference by q-value and
// then order; */* and an absent header mean JSON, as at the API server.
// Media types that ask the API server to transform the answer (as=Table,
// as=PartialObjectMetadata, ...) are skipped: the view filters Services, and
// a table or metadata-only answer would not show it what it filters on.
// ok is false when nothing acceptable remains (406).
func negotiateMedia(accept []string) (m wire.Media, ok bool) {
	m, _, ok = bestPlain(accept)
	return m, ok
}

// bestPlain is negotiateMedia with the q-value of the clause it picked.
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

// plainPreferred says whether the API server answers a GET of a Node with
// these Accept headers as a plain object in JSON or protobuf, and in which:
// the gate then asks for exactly that and checks the answer (checkAnswer);
// for any other header it holds the read (nodehold.go), which is sound for
// any form: erring that way costs reads, never the view nor the form.
//
// The decision is the API server's reading of the header, not
// mime.ParseMediaType's (serverAccept): the API server reads the first
// Accept header only; answers 406 before it negotiates unless a clause names
// */* or one of its media types exactly (its router's check: application/*
// alone is a 406); compares types and parameter names as written; parses
// q as a float32 (0 where it cannot), and sorts the clauses with a
// comparison that puts a clause without wildcards before one with them
// whatever their q-values. The clause it serves first must be plain; any
// clause in another form must come after it in every order of the API
// server's comparison (a tie is another form: kubectl's fallbacks are tied),
// and the plain clause must have a q-value above 0. A header whose clauses
// the two parsers read differently is held.
func plainPreferred(accept []string) (wire.Media, bool) {
	switch {
	case len(accept) == 0 || (len(accept) == 1 && accept[0] == ""):
		return wire.MediaJSON, true // the API server's default
	case len(accept) > 1:
		return wire.MediaNone, false // the API server reads the first one only
	}
	clauses, ok := serverAccept(accept[0])
	if !ok || !slices.ContainsFunc(clauses, func(c serverClause) bool { return c.routed }) {
		return wire.MediaNone, false // the API server's 406, or a read the gate is not sure of
	}
	sort.Sort(serverOrder(clauses))
	for i, c := range clauses {
		switch c.form {
		case formNever:
			continue
		case formOther:
			return wire.MediaNone, false
		}
		if !(c.q > 0) {
			return wire.MediaNone, false
		}
		for _, o := range clauses[i+1:] {
			if o.form == formOther && !(serverBefore(c, o) && !serverBefore(o, c)) {
				return wire.MediaNone, false
			}
		}
		return c.kind, true
	}
	return wire.MediaNone, false
}

// clauseForm is what the API server may answer for an Accept clause.
type clauseForm int

const (
	// formOther: another form (Table, PartialObjectMetadata, YAML, CBOR,
	// pretty JSON, ...) or one the gate does not know.
	formOther clauseForm = iota
	// formPlain: a plain object, in serverClause.kind.
	formPlain
	// formNever: no media type of the API server (its are all application/*).
	formNever
)

// serverClause is an Accept clause as the API server reads it.
type serverClause struct {
	// routed: the API server's router takes the clause for one of the
	// media types it produces (*/* or an exact name, parameters aside).
	routed       bool
	typ, subtype string
	q            float64
	form         clauseForm
	kind         wire.Media
}

// maxServerClauses bounds the clauses plainPreferred decides on: up to that
// many, Go's sort is an insertion sort, whose order the gate reproduces.
const maxServerClauses = 12

// serverMediaParams are the Accept parameters the API server acts on: any
// of them makes a clause another form (or one it skips).
var serverMediaParams = map[string]bool{"as": true, "g": true, "v": true, "stream": true, "sv": true, "export": true, "pretty": true, "profile": true}

// routedMediaTypes are media ranges the API server's router (go-restful)
// accepts for a GET of a Node: */* and media types the API server surely
// produces (CBOR only with a feature gate).
var routedMediaTypes = map[string]bool{"*/*": true, wire.ContentTypeJSON: true, wire.ContentTypeProtobuf: true, "application/yaml": true}

// serverAccept reads an Accept header as the API server does
// (k8s.io/apiserver's negotiation): clauses split on ',', parameters on ';'
// and '=', no quoting, only spaces trimmed, q a float32 (0 when it does not
// parse), clauses without a '/' (but "*") or with a second '/' skipped, and
// so are parameters without a value or with a second '='. ok is false when
// mime.ParseMediaType reads any clause otherwise (case, quotes, tabs,
// duplicates) or there are too many clauses.
func serverAccept(header string) (out []serverClause, ok bool) {
	trim := func(s string) string { return strings.Trim(s, " ") }
	for part := range strings.SplitSeq(header, ",") {
		part = trim(part)
		rng, rawParams, _ := strings.Cut(part, ";")
		c := serverClause{q: 1, routed: routedMediaTypes[trim(rng)]}
		typ, sub, slash := strings.Cut(rng, "/")
		c.typ = trim(typ)
		switch {
		case !slash && c.typ == "*":
			c.subtype = "*"
		case !slash || strings.Contains(sub, "/"):
			if strings.TrimSpace(part) == "" {
				continue // skipped by both
			}
			return nil, false // skipped by the API server, read by mime perhaps
		default:
			c.subtype = trim(sub)
		}
		params := map[string]string{}
		rawQ, hasQ := "", false
		if rawParams != "" {
			for p := range strings.SplitSeq(rawParams, ";") {
				k, v, eq := strings.Cut(p, "=")
				if !eq || strings.Contains(v, "=") {
					continue
				}
				if k = trim(k); k == "q" {
					rawQ, hasQ = v, true
					c.q, _ = strconv.ParseFloat(v, 32)
					continue
				}
				params[k] = trim(v)
			}
		}
		// what mime.ParseMediaType reads must be the same
		mt, mp, err := mime.ParseMediaType(part)
		if err != nil || mt != c.typ+"/"+c.subtype {
			return nil, false
		}
		if mq, set := mp["q"]; set != hasQ || mq != rawQ {
			return nil, false
		} else if _, err := strconv.ParseFloat(rawQ, 32); hasQ && err != nil {
			return nil, false
		}
		delete(mp, "q")
		if len(mp) != len(params) {
			return nil, false
		}
		transforms := false
		for k, v := range params {
			if mv, set := mp[k]; !set || mv != v {
				return nil, false
			}
			transforms = transforms || serverMediaParams[k]
		}
		switch {
		case c.typ != "application" && c.typ != "*", c.typ == "*" && c.subtype != "*":
			c.form = formNever
		case transforms:
		case c.subtype == "*", c.subtype == "json":
			c.form, c.kind = formPlain, wire.MediaJSON
		case c.subtype == "vnd.kubernetes.protobuf":
			c.form, c.kind = formPlain, wire.MediaProtobuf
		}
		if out = append(out, c); len(out) > maxServerClauses {
			return nil, false
		}
	}
	return out, true
}

// serverBefore is the API server's comparison of two Accept clauses: a
// higher q-value first, and a clause without a wildcard before one with it,
// whatever their q-values (it is not an order: at a tie, and between a
// wildcard of higher q and a clause without, both come first).
func serverBefore(a, b serverClause) bool {
	return a.q > b.q || (a.typ != "*" && b.typ == "*") || (a.subtype != "*" && b.subtype == "*")
}

// serverOrder sorts Accept clauses as the API server does (sort.Sort).
type serverOrder []serverClause

func (s serverOrder) Len() int           { return len(s) }
func (s serverOrder) Less(i, j int) bool { return serverBefore(s[i], s[j]) }
func (s serverOrder) Swap(i, j int)      { s[i], s[j] = s[j], s[i] }

// prepareAnswerRequest asks the API server for exactly the encoding the gate
// will read. The gate reads the answer uncompressed: where the client accepts
// gzip, the gate's transport asks for it and unpacks it (the link to the API
// server carries what it would have carried for the client); where it does
// not, the gate does not either.
func prepareAnswerRequest(r *http.Request, media wire.Media) {
	r.Header.Set("Accept", media.ContentType())
	if strings.Contains(strings.ToLower(strings.Join(r.Header.Values("Accept-Encoding"), ",")), "gzip") {
		r.Header.Del("Accept-Encoding")
	} else {
		r.Header.Set("Accept-Encoding", "identity")
	}
	r.RequestURI = ""
}
