package nodeview

import (
	"mime"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/wire"
)

// plainPreferred says whether the API server answers a GET of a Node with
// these Accept headers as a plain object in JSON or protobuf, and in which:
// the gate then asks for exactly that and checks the answer (CheckAnswer);
// for any other header it holds the read (nodehold.go in package proxy), which is sound for
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
