package proxy

import (
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protowire"
)

// The object layer: one Service as the view reads it from the wire. A scanner
// reads a Service's bytes once, JSON object or protobuf message, into a
// service: the facts the view decides on, the bytes as the API server sent
// them, and the edits that write those bytes without spec.loadBalancerClass.
// Nothing here decides what the CCM sees (serviceview.go does) and nothing
// here writes an answer (serviceemit.go does).

// LoadBalancerCleanupFinalizer is the finalizer the service controller of
// k8s.io/cloud-provider puts on a Service before it creates its load balancer
// and removes once the load balancer is gone.
const LoadBalancerCleanupFinalizer = "service.kubernetes.io/load-balancer-cleanup"

const serviceTypeLoadBalancer = "LoadBalancer"

// initialEventsEndAnnotation marks the bookmark that ends a WatchList's
// initial events (metav1.InitialEventsAnnotationKey).
const initialEventsEndAnnotation = "k8s.io/initial-events-end"

// serviceFacts is what the view reads of a Service.
type serviceFacts struct {
	namespace, name, uid, resourceVersion string
	// typ is spec.type ("" means ClusterIP).
	typ string
	// class is spec.loadBalancerClass, hasClass whether it is set.
	class    string
	hasClass bool
	// cleanup: metadata.finalizers holds LoadBalancerCleanupFinalizer.
	cleanup bool
	// initialEventsEnd: metadata.annotations holds
	// k8s.io/initial-events-end=true (a WatchList's last initial bookmark).
	initialEventsEnd bool
}

func (f serviceFacts) key() string { return f.namespace + "/" + f.name }

// service is one Service read from the wire.
type service struct {
	serviceFacts
	// raw is the Service as the API server encoded it: a JSON object, or a
	// protobuf Service message (without its envelope).
	raw []byte
	// edits turn raw into the Service without spec.loadBalancerClass.
	edits []edit
}

// withoutClassLen is the length of the Service without its class.
func (s *service) withoutClassLen() int { return editedLen(s.raw, s.edits) }

// appendWithoutClass appends the Service without its class to dst.
func (s *service) appendWithoutClass(dst []byte) []byte { return appendEdited(dst, s.raw, s.edits) }

// writeWithoutClass writes the Service without its class.
func (s *service) writeWithoutClass(w io.Writer) error { return writeEdited(w, s.raw, s.edits) }

// jsonServiceScanner reads JSON Services, one after the other; the service it
// returns is valid until the next scan.
type jsonServiceScanner struct {
	// meta: read name, namespace, uid, resourceVersion and the
	// initial-events-end annotation too (a list's items need none of them).
	meta bool
	// class is the view's class, kept without allocating when it matches.
	class string
	s     service
	// seen are the members a Service may hold only once that it holds.
	seen member
}

// member is one of the members a Service may hold only once.
type member uint8

const (
	memberMetadata member = 1 << iota
	memberSpec
	memberFinalizers
	memberAnnotations
	memberClass
	memberType
)

// errRepeated: a Service repeats a member the view decides on. The API server
// never writes one, and which one counts would be up to the decoder.
var errRepeated = fmt.Errorf("%w: repeated member", errJSONSyntax)

// scan reads the Service object b (nothing but spaces around it).
func (sc *jsonServiceScanner) scan(b []byte) (*service, error) {
	start := skipJSONSpace(b, 0)
	end, err := sc.scanObject(b, start)
	if err != nil {
		return nil, err
	}
	if skipJSONSpace(b, end) != len(b) {
		return nil, fmt.Errorf("%w: data after the Service", errJSONSyntax)
	}
	return sc.done(b, start, end), nil
}

// scanAt reads the Service object that starts at b[start] and returns it and
// the index just past it (errJSONIncomplete: b ends inside it).
func (sc *jsonServiceScanner) scanAt(b []byte, start int) (*service, int, error) {
	end, err := sc.scanObject(b, start)
	if err != nil {
		return nil, end, err
	}
	return sc.done(b, start, end), end, nil
}

// done sets raw to b[start:end] and moves the edits into it.
func (sc *jsonServiceScanner) done(b []byte, start, end int) *service {
	sc.s.raw = b[start:end]
	for i := range sc.s.edits {
		sc.s.edits[i].start -= start
		sc.s.edits[i].end -= start
	}
	return &sc.s
}

func (sc *jsonServiceScanner) once(m member, name string) error {
	if sc.seen&m != 0 {
		return fmt.Errorf("%w %q", errRepeated, name)
	}
	sc.seen |= m
	return nil
}

func (sc *jsonServiceScanner) scanObject(b []byte, start int) (int, error) {
	sc.s.serviceFacts = serviceFacts{}
	sc.s.edits = sc.s.edits[:0]
	sc.seen = 0
	return jsonEachMember(b, start, func(key []byte, _, vs int) (int, error) {
		switch {
		case jsonStringIs(key, "metadata"):
			if err := sc.once(memberMetadata, "metadata"); err != nil || b[vs] != '{' {
				return skipValue(b, vs, err)
			}
			return sc.metadata(b, vs)
		case jsonStringIs(key, "spec"):
			if err := sc.once(memberSpec, "spec"); err != nil || b[vs] != '{' {
				return skipValue(b, vs, err)
			}
			return sc.spec(b, vs)
		}
		return jsonValueEnd(b, vs)
	})
}

// skipValue returns the end of the value at b[vs], or err.
func skipValue(b []byte, vs int, err error) (int, error) {
	if err != nil {
		return vs, err
	}
	return jsonValueEnd(b, vs)
}

func (sc *jsonServiceScanner) metadata(b []byte, start int) (int, error) {
	return jsonEachMember(b, start, func(key []byte, _, vs int) (int, error) {
		var field *string
		switch {
		case jsonStringIs(key, "finalizers"):
			if err := sc.once(memberFinalizers, "metadata.finalizers"); err != nil || b[vs] != '[' {
				return skipValue(b, vs, err)
			}
			return jsonArrayElements(b, vs, func(s, e int) error {
				if jsonStringIs(b[s:e], LoadBalancerCleanupFinalizer) {
					sc.s.cleanup = true
				}
				return nil
			})
		case !sc.meta:
			return jsonValueEnd(b, vs)
		case jsonStringIs(key, "annotations"):
			if err := sc.once(memberAnnotations, "metadata.annotations"); err != nil || b[vs] != '{' {
				return skipValue(b, vs, err)
			}
			return jsonEachMember(b, vs, func(k []byte, _, avs int) (int, error) {
				ave, err := jsonValueEnd(b, avs)
				if err == nil && jsonStringIs(k, initialEventsEndAnnotation) {
					sc.s.initialEventsEnd = jsonStringIs(b[avs:ave], "true")
				}
				return ave, err
			})
		case jsonStringIs(key, "name"):
			field = &sc.s.name
		case jsonStringIs(key, "namespace"):
			field = &sc.s.namespace
		case jsonStringIs(key, "uid"):
			field = &sc.s.uid
		case jsonStringIs(key, "resourceVersion"):
			field = &sc.s.resourceVersion
		default:
			return jsonValueEnd(b, vs)
		}
		ve, err := jsonValueEnd(b, vs)
		if err != nil {
			return ve, err
		}
		*field, _, err = jsonOptionalString(b[vs:ve])
		return ve, err
	})
}

// spec reads spec.type and spec.loadBalancerClass, and cuts the class
// member together with the comma that joins it to a neighbour.
func (sc *jsonServiceScanner) spec(b []byte, start int) (int, error) {
	prevEnd := -1 // where the member before the current one ends
	cut, first := span{-1, -1}, false
	next := -1 // where the member after the class begins
	end, err := jsonEachMember(b, start, func(key []byte, ks, vs int) (int, error) {
		if cut.start >= 0 && next < 0 {
			next = ks
		}
		ve, err := jsonValueEnd(b, vs)
		if err != nil {
			return ve, err
		}
		v := b[vs:ve]
		switch {
		case jsonStringIs(key, "loadBalancerClass"):
			if err := sc.once(memberClass, "spec.loadBalancerClass"); err != nil {
				return ve, err
			}
			if prevEnd >= 0 {
				cut = span{prevEnd, ve} // `, "loadBalancerClass":"x"`
			} else {
				cut, first = span{ks, ve}, true // `"loadBalancerClass":"x"` and the comma after it
			}
			if s, ok := interned(jsonPlainString(v), sc.class); ok {
				sc.s.class, sc.s.hasClass = s, true
				break
			}
			sc.s.class, sc.s.hasClass, err = jsonOptionalString(v)
		case jsonStringIs(key, "type"):
			if err := sc.once(memberType, "spec.type"); err != nil {
				return ve, err
			}
			if s, ok := interned(jsonPlainString(v), serviceTypeLoadBalancer, "ClusterIP", "NodePort"); ok {
				sc.s.typ = s
				break
			}
			sc.s.typ, _, err = jsonOptionalString(v)
		}
		prevEnd = ve
		return ve, err
	})
	if err != nil || cut.start < 0 {
		return end, err
	}
	if first && next >= 0 {
		cut.end = next
	}
	sc.s.edits = append(sc.s.edits, edit{start: cut.start, end: cut.end})
	return end, nil
}

// Field numbers of the Service's protobuf message (k8s.io/api/core/v1).
const (
	pbServiceMetadata       protowire.Number = 1
	pbServiceSpec           protowire.Number = 2
	pbMetaName              protowire.Number = 1
	pbMetaNamespace         protowire.Number = 3
	pbMetaUID               protowire.Number = 5
	pbMetaResourceVersion   protowire.Number = 6
	pbMetaLabels            protowire.Number = 11
	pbMetaAnnotations       protowire.Number = 12
	pbMetaFinalizers        protowire.Number = 14
	pbSpecType              protowire.Number = 4
	pbSpecLoadBalancerClass protowire.Number = 21
)

// protoServiceScanner reads protobuf Service messages, one after the other;
// the service it returns is valid until the next scan.
type protoServiceScanner struct {
	meta  bool
	class string
	s     service
	// prefixes holds the rewritten spec field headers the edits point to;
	// headers and cuts are scratch space.
	prefixes []byte
	headers  []protoSpecHeader
	cuts     []span
}

// protoSpecHeader is a spec field's new header: edit is the edit that
// writes it, prefixes[from:to] the header.
type protoSpecHeader struct{ edit, from, to int }

// scan reads a Service message. Repeated embedded messages merge and the
// last scalar wins, as protobuf decoding does; every class field is cut.
func (sc *protoServiceScanner) scan(msg []byte) (*service, error) {
	sc.s = service{raw: msg, edits: sc.s.edits[:0]}
	// The edits point into prefixes, which may grow: collect the headers'
	// offsets first and attach them once the message is read.
	sc.prefixes, sc.headers = sc.prefixes[:0], sc.headers[:0]
	err := protoFields(msg, func(f protoField) error {
		if f.typ != protowire.BytesType {
			return nil
		}
		switch f.num {
		case pbServiceMetadata:
			return protoFields(f.value, sc.metadataField)
		case pbServiceSpec:
			valueStart := f.end - len(f.value)
			cuts := sc.cuts[:0]
			cut := 0
			if err := protoFields(f.value, func(s protoField) error {
				switch s.num {
				case pbSpecType:
					if s.typ != protowire.BytesType {
						return fmt.Errorf("%w: spec.type", errProto)
					}
					if t, ok := interned(s.value, serviceTypeLoadBalancer, "ClusterIP", "NodePort"); ok {
						sc.s.typ = t
					} else {
						sc.s.typ = string(s.value)
					}
				case pbSpecLoadBalancerClass:
					if s.typ != protowire.BytesType {
						return fmt.Errorf("%w: spec.loadBalancerClass", errProto)
					}
					if c, ok := interned(s.value, sc.class); ok {
						sc.s.class = c
					} else {
						sc.s.class = string(s.value)
					}
					sc.s.hasClass = true
					cuts = append(cuts, span{valueStart + s.start, valueStart + s.end})
					cut += s.end - s.start
				}
				return nil
			}); err != nil {
				return err
			}
			sc.cuts = cuts
			if len(cuts) == 0 {
				return nil
			}
			// The spec field's header with the new length, then the cuts.
			from := len(sc.prefixes)
			sc.prefixes = protowire.AppendVarint(protowire.AppendTag(sc.prefixes, pbServiceSpec, protowire.BytesType), uint64(len(f.value)-cut))
			sc.headers = append(sc.headers, protoSpecHeader{edit: len(sc.s.edits), from: from, to: len(sc.prefixes)})
			sc.s.edits = append(sc.s.edits, edit{start: f.start, end: valueStart})
			for _, c := range cuts {
				sc.s.edits = append(sc.s.edits, edit{start: c.start, end: c.end})
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, h := range sc.headers {
		sc.s.edits[h.edit].with = sc.prefixes[h.from:h.to]
	}
	return &sc.s, nil
}

func (sc *protoServiceScanner) metadataField(m protoField) error {
	if m.typ != protowire.BytesType {
		return nil
	}
	var field *string
	switch m.num {
	case pbMetaFinalizers:
		if string(m.value) == LoadBalancerCleanupFinalizer {
			sc.s.cleanup = true
		}
		return nil
	case pbMetaAnnotations:
		if !sc.meta {
			return nil
		}
		// A map entry: 1: key, 2: value.
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
		if string(key) == initialEventsEndAnnotation {
			sc.s.initialEventsEnd = string(value) == "true"
		}
		return err
	case pbMetaName:
		field = &sc.s.name
	case pbMetaNamespace:
		field = &sc.s.namespace
	case pbMetaUID:
		field = &sc.s.uid
	case pbMetaResourceVersion:
		field = &sc.s.resourceVersion
	default:
		return nil
	}
	if sc.meta {
		*field = string(m.value)
	}
	return nil
}
