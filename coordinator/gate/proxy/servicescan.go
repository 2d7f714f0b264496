package proxy

import (
	"bufio"
	"bytes"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// The scanners read a Service once: the facts the view decides on, and where
// spec.loadBalancerClass sits, so that the Service can be written without it
// by copying the bytes around it. A scanner is reused from Service to Service
// (a list or a watch reads thousands); its slices are scratch space.

// span is a byte range [start, end).
type span struct{ start, end int }

// interned returns the one of common that raw holds (a string without
// allocating one per Service); ok is false for anything else, and for nil.
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

// jsonServiceScan reads a JSON Service.
type jsonServiceScan struct {
	facts serviceFacts
	// meta: read name, namespace, uid and resourceVersion too (watches need
	// the key; lists do not).
	meta bool
	// class is the view's class, kept without allocating when it matches.
	class string
	// edits turn the Service into the Service without its class.
	edits []jsonEdit
	spec  []jsonMember
	// specClass marks the members of spec that are its class.
	specClass []bool
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

// scan reads the Service object b (nothing but spaces around it).
func (sc *jsonServiceScan) scan(b []byte) error {
	end, err := sc.scanObject(b, skipJSONSpace(b, 0))
	if err != nil {
		return err
	}
	if skipJSONSpace(b, end) != len(b) {
		return fmt.Errorf("%w: data after the Service", errJSONSyntax)
	}
	return nil
}

// scanObject reads the Service object that starts at b[start] and returns the
// index just past it (errJSONIncomplete: b ends inside it). The edits are
// relative to b.
func (sc *jsonServiceScan) scanObject(b []byte, start int) (int, error) {
	sc.facts = serviceFacts{}
	sc.edits = sc.edits[:0]
	return jsonEachMember(b, start, func(key []byte, _, vs int) (int, error) {
		switch {
		case b[vs] == '{' && jsonStringIs(key, "metadata"):
			return sc.metadata(b, vs)
		case b[vs] == '{' && jsonStringIs(key, "spec"):
			return sc.specObject(b, vs)
		}
		return jsonValueEnd(b, vs)
	})
}

func (sc *jsonServiceScan) metadata(b []byte, start int) (int, error) {
	return jsonEachMember(b, start, func(key []byte, _, vs int) (int, error) {
		if jsonStringIs(key, "finalizers") {
			sc.facts.cleanup = false
			if b[vs] != '[' {
				return jsonValueEnd(b, vs)
			}
			return jsonArrayElements(b, vs, func(s, e int) error {
				if jsonStringIs(b[s:e], LoadBalancerCleanupFinalizer) {
					sc.facts.cleanup = true
				}
				return nil
			})
		}
		ve, err := jsonValueEnd(b, vs)
		if err != nil || !sc.meta {
			return ve, err
		}
		var field *string
		switch {
		case jsonStringIs(key, "name"):
			field = &sc.facts.name
		case jsonStringIs(key, "namespace"):
			field = &sc.facts.namespace
		case jsonStringIs(key, "uid"):
			field = &sc.facts.uid
		case jsonStringIs(key, "resourceVersion"):
			field = &sc.facts.resourceVersion
		default:
			return ve, nil
		}
		*field, _, err = jsonOptionalString(b[vs:ve])
		return ve, err
	})
}

func (sc *jsonServiceScan) specObject(b []byte, start int) (int, error) {
	sc.spec, sc.specClass = sc.spec[:0], sc.specClass[:0]
	classes := 0
	end, err := jsonEachMember(b, start, func(key []byte, ks, vs int) (int, error) {
		ve, err := jsonValueEnd(b, vs)
		if err != nil {
			return ve, err
		}
		isClass := jsonStringIs(key, "loadBalancerClass")
		sc.spec = append(sc.spec, jsonMember{keyStart: ks, valueStart: vs, valueEnd: ve})
		sc.specClass = append(sc.specClass, isClass)
		v := b[vs:ve]
		switch {
		case isClass:
			classes++
			if s, ok := interned(jsonPlainString(v), sc.class); ok {
				sc.facts.class, sc.facts.hasClass = s, true
				return ve, nil
			}
			sc.facts.class, sc.facts.hasClass, err = jsonOptionalString(v)
		case jsonStringIs(key, "type"):
			if s, ok := interned(jsonPlainString(v), serviceTypeLoadBalancer, "ClusterIP", "NodePort"); ok {
				sc.facts.typ = s
				return ve, nil
			}
			sc.facts.typ, _, err = jsonOptionalString(v)
		}
		return ve, err
	})
	if err != nil || classes == 0 {
		return end, err
	}
	if classes > 1 {
		// Never from the API server: rebuild the spec without any of them.
		spec, _, err := jsonWithoutMembers(b, start, func(k string) bool { return k == "loadBalancerClass" })
		if err != nil {
			return end, err
		}
		sc.edits = append(sc.edits, jsonEdit{start: start, end: end, with: spec})
		return end, nil
	}
	for k, m := range sc.spec {
		if !sc.specClass[k] {
			continue
		}
		switch {
		case k+1 < len(sc.spec): // `"loadBalancerClass":"x", ` before the next member
			sc.edits = append(sc.edits, jsonEdit{start: m.keyStart, end: sc.spec[k+1].keyStart})
		case k > 0: // `, "loadBalancerClass":"x"` after the previous one
			sc.edits = append(sc.edits, jsonEdit{start: sc.spec[k-1].valueEnd, end: m.valueEnd})
		default: // the only member
			sc.edits = append(sc.edits, jsonEdit{start: m.keyStart, end: m.valueEnd})
		}
	}
	return end, nil
}

// write writes b, the Service scanned last, without its class.
func (sc *jsonServiceScan) write(w *bufio.Writer, b []byte) error {
	at := 0
	for _, e := range sc.edits {
		_, _ = w.Write(b[at:e.start])
		_, _ = w.Write(e.with)
		at = e.end
	}
	_, err := w.Write(b[at:])
	return err
}

// withoutClass returns b, the Service scanned last, without its class (b
// itself when it has none).
func (sc *jsonServiceScan) withoutClass(b []byte) []byte {
	return applyJSONEdits(b, sc.edits)
}

// protoServiceScan reads a Service message.
type protoServiceScan struct {
	facts serviceFacts
	meta  bool
	class string
	// initialEventsEnd: the Service (a bookmark) carries the annotation
	// k8s.io/initial-events-end=true.
	initialEventsEnd bool
	// specs are the spec fields that hold a class; cuts the class fields.
	specs []protoSpec
	cuts  []span
}

// protoSpec is one spec field of a Service that holds a class.
type protoSpec struct {
	field span
	// valueStart is where its message begins; cuts[from:to] are its classes.
	valueStart int
	from, to   int
	// valueLen is the length of its message without the classes.
	valueLen int
}

// scan reads a Service message. Repeated embedded messages merge and the last
// scalar wins, as protobuf decoding does.
func (sc *protoServiceScan) scan(msg []byte) error {
	sc.facts = serviceFacts{}
	sc.initialEventsEnd = false
	sc.specs, sc.cuts = sc.specs[:0], sc.cuts[:0]
	return protoFields(msg, func(f protoField) error {
		if f.typ != protowire.BytesType {
			return nil
		}
		switch f.num {
		case pbServiceMetadata:
			return protoFields(f.value, sc.metadataField)
		case pbServiceSpec:
			valueStart := f.end - len(f.value)
			from := len(sc.cuts)
			if err := protoFields(f.value, func(s protoField) error {
				switch s.num {
				case pbSpecType:
					if s.typ != protowire.BytesType {
						return fmt.Errorf("%w: spec.type", errProto)
					}
					if t, ok := interned(s.value, serviceTypeLoadBalancer, "ClusterIP", "NodePort"); ok {
						sc.facts.typ = t
					} else {
						sc.facts.typ = string(s.value)
					}
				case pbSpecLoadBalancerClass:
					if s.typ != protowire.BytesType {
						return fmt.Errorf("%w: spec.loadBalancerClass", errProto)
					}
					if c, ok := interned(s.value, sc.class); ok {
						sc.facts.class = c
					} else {
						sc.facts.class = string(s.value)
					}
					sc.facts.hasClass = true
					sc.cuts = append(sc.cuts, span{start: valueStart + s.start, end: valueStart + s.end})
				}
				return nil
			}); err != nil {
				return err
			}
			if to := len(sc.cuts); to > from {
				cut := 0
				for _, c := range sc.cuts[from:to] {
					cut += c.end - c.start
				}
				sc.specs = append(sc.specs, protoSpec{field: span{f.start, f.end}, valueStart: valueStart, from: from, to: to, valueLen: len(f.value) - cut})
			}
		}
		return nil
	})
}

func (sc *protoServiceScan) metadataField(m protoField) error {
	if m.typ != protowire.BytesType {
		return nil
	}
	var field *string
	switch m.num {
	case pbMetaFinalizers:
		if string(m.value) == LoadBalancerCleanupFinalizer {
			sc.facts.cleanup = true
		}
		return nil
	case pbMetaAnnotations:
		var key, value []byte
		err := protoFields(m.value, func(e protoField) error {
			switch {
			case e.typ != protowire.BytesType:
			case e.num == 1:
				key = e.value
			case e.num == 2:
				value = e.value
			}
			return nil
		})
		if string(key) == initialEventsEndAnnotation && string(value) == "true" {
			sc.initialEventsEnd = true
		}
		return err
	case pbMetaName:
		field = &sc.facts.name
	case pbMetaNamespace:
		field = &sc.facts.namespace
	case pbMetaUID:
		field = &sc.facts.uid
	case pbMetaResourceVersion:
		field = &sc.facts.resourceVersion
	default:
		return nil
	}
	if sc.meta {
		*field = string(m.value)
	}
	return nil
}

// strippedLen is the length of msg, the Service scanned last, without its class.
func (sc *protoServiceScan) strippedLen(msg []byte) int {
	n := len(msg)
	for _, s := range sc.specs {
		n -= s.field.end - s.field.start
		n += protowire.SizeTag(pbServiceSpec) + protowire.SizeBytes(s.valueLen)
	}
	return n
}

// appendStripped appends msg, the Service scanned last, without its class.
func (sc *protoServiceScan) appendStripped(dst, msg []byte) []byte {
	at := 0
	for _, s := range sc.specs {
		dst = append(dst, msg[at:s.field.start]...)
		dst = protowire.AppendTag(dst, pbServiceSpec, protowire.BytesType)
		dst = protowire.AppendVarint(dst, uint64(s.valueLen))
		v := s.valueStart
		for _, c := range sc.cuts[s.from:s.to] {
			dst = append(dst, msg[v:c.start]...)
			v = c.end
		}
		dst = append(dst, msg[v:s.field.end]...)
		at = s.field.end
	}
	return append(dst, msg[at:]...)
}
