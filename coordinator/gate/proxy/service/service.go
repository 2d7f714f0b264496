package service

import (
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/wire"
)

// One Service as the view reads it from the wire. A scanner reads a
// Service's bytes once, JSON object or protobuf message, into a Service: the
// facts the view decides on, the bytes as the API server sent them, and the
// edits that write those bytes without spec.loadBalancerClass. Nothing here
// decides what the CCM sees (package serviceview does) and nothing here
// writes an answer (serviceview's emission does).

// LoadBalancerCleanupFinalizer is the finalizer the service controller of
// k8s.io/cloud-provider puts on a Service before it creates its load balancer
// and removes once the load balancer is gone.
const LoadBalancerCleanupFinalizer = "service.kubernetes.io/load-balancer-cleanup"

// TypeLoadBalancer is the spec.type of a Service with a load balancer.
const TypeLoadBalancer = "LoadBalancer"

// initialEventsEndAnnotation marks the bookmark that ends a WatchList's
// initial events (metav1.InitialEventsAnnotationKey).
const initialEventsEndAnnotation = "k8s.io/initial-events-end"

// Facts is what the view reads of a Service.
type Facts struct {
	Namespace, Name, UID, ResourceVersion string
	// typ is spec.type ("" means ClusterIP).
	Type string
	// class is spec.loadBalancerClass, hasClass whether it is set.
	Class    string
	HasClass bool
	// cleanup: metadata.finalizers holds LoadBalancerCleanupFinalizer.
	Cleanup bool
	// initialEventsEnd: metadata.annotations holds
	// k8s.io/initial-events-end=true (a WatchList's last initial bookmark).
	InitialEventsEnd bool
}

func (f Facts) Key() string { return f.Namespace + "/" + f.Name }

// Service is one Service read from the wire.
type Service struct {
	Facts
	// raw is the Service as the API server encoded it: a JSON object, or a
	// protobuf Service message (without its envelope).
	raw []byte
	// edits turn raw into the Service without spec.loadBalancerClass.
	edits []wire.Edit
}

// WithoutClassLen is the length of the Service without its class.
func (s *Service) WithoutClassLen() int { return wire.EditedLen(s.raw, s.edits) }

// AppendWithoutClass appends the Service without its class to dst.
func (s *Service) AppendWithoutClass(dst []byte) []byte {
	return wire.AppendEdited(dst, s.raw, s.edits)
}

// WriteWithoutClass writes the Service without its class.
func (s *Service) WriteWithoutClass(w io.Writer) error { return wire.WriteEdited(w, s.raw, s.edits) }

// jsonServiceScanner reads JSON Services, one after the other; the service it
// returns is valid until the next scan.
type jsonServiceScanner struct {
	// meta: read name, namespace, uid, resourceVersion and the
	// initial-events-end annotation too (a list's items need none of them).
	meta bool
	// class is the view's class, kept without allocating when it matches.
	class string
	s     Service
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
var errRepeated = fmt.Errorf("%w: repeated member", wire.ErrJSONSyntax)

// scan reads the Service object b (nothing but spaces around it).
func (sc *jsonServiceScanner) scan(b []byte) (*Service, error) {
	start := wire.SkipJSONSpace(b, 0)
	end, err := sc.scanObject(b, start)
	if err != nil {
		return nil, err
	}
	if wire.SkipJSONSpace(b, end) != len(b) {
		return nil, fmt.Errorf("%w: data after the Service", wire.ErrJSONSyntax)
	}
	return sc.done(b, start, end), nil
}

// scanAt reads the Service object that starts at b[start] and returns it and
// the index just past it (errJSONIncomplete: b ends inside it).
func (sc *jsonServiceScanner) scanAt(b []byte, start int) (*Service, int, error) {
	end, err := sc.scanObject(b, start)
	if err != nil {
		return nil, end, err
	}
	return sc.done(b, start, end), end, nil
}

// done sets raw to b[start:end] and moves the edits into it.
func (sc *jsonServiceScanner) done(b []byte, start, end int) *Service {
	sc.s.raw = b[start:end]
	for i := range sc.s.edits {
		sc.s.edits[i].Start -= start
		sc.s.edits[i].End -= start
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
	sc.s.Facts = Facts{}
	sc.s.edits = sc.s.edits[:0]
	sc.seen = 0
	return wire.JSONEachMember(b, start, func(key []byte, _, vs int) (int, error) {
		switch {
		case wire.JSONStringIs(key, "metadata"):
			if err := sc.once(memberMetadata, "metadata"); err != nil || b[vs] != '{' {
				return skipValue(b, vs, err)
			}
			return sc.metadata(b, vs)
		case wire.JSONStringIs(key, "spec"):
			if err := sc.once(memberSpec, "spec"); err != nil || b[vs] != '{' {
				return skipValue(b, vs, err)
			}
			return sc.spec(b, vs)
		}
		return wire.JSONValueEnd(b, vs)
	})
}

// skipValue returns the end of the value at b[vs], or err.
func skipValue(b []byte, vs int, err error) (int, error) {
	if err != nil {
		return vs, err
	}
	return wire.JSONValueEnd(b, vs)
}

func (sc *jsonServiceScanner) metadata(b []byte, start int) (int, error) {
	return wire.JSONEachMember(b, start, func(key []byte, _, vs int) (int, error) {
		var field *string
		switch {
		case wire.JSONStringIs(key, "finalizers"):
			if err := sc.once(memberFinalizers, "metadata.finalizers"); err != nil || b[vs] != '[' {
				return skipValue(b, vs, err)
			}
			return wire.JSONArrayElements(b, vs, func(s, e int) error {
				if wire.JSONStringIs(b[s:e], LoadBalancerCleanupFinalizer) {
					sc.s.Cleanup = true
				}
				return nil
			})
		case !sc.meta:
			return wire.JSONValueEnd(b, vs)
		case wire.JSONStringIs(key, "annotations"):
			if err := sc.once(memberAnnotations, "metadata.annotations"); err != nil || b[vs] != '{' {
				return skipValue(b, vs, err)
			}
			return wire.JSONEachMember(b, vs, func(k []byte, _, avs int) (int, error) {
				ave, err := wire.JSONValueEnd(b, avs)
				if err == nil && wire.JSONStringIs(k, initialEventsEndAnnotation) {
					sc.s.InitialEventsEnd = wire.JSONStringIs(b[avs:ave], "true")
				}
				return ave, err
			})
		case wire.JSONStringIs(key, "name"):
			field = &sc.s.Name
		case wire.JSONStringIs(key, "namespace"):
			field = &sc.s.Namespace
		case wire.JSONStringIs(key, "uid"):
			field = &sc.s.UID
		case wire.JSONStringIs(key, "resourceVersion"):
			field = &sc.s.ResourceVersion
		default:
			return wire.JSONValueEnd(b, vs)
		}
		ve, err := wire.JSONValueEnd(b, vs)
		if err != nil {
			return ve, err
		}
		*field, _, err = wire.JSONOptionalString(b[vs:ve])
		return ve, err
	})
}

// spec reads spec.type and spec.loadBalancerClass, and cuts the class
// member together with the comma that joins it to a neighbour.
func (sc *jsonServiceScanner) spec(b []byte, start int) (int, error) {
	prevEnd := -1 // where the member before the current one ends
	cut, first := wire.Span{Start: -1, End: -1}, false
	next := -1 // where the member after the class begins
	end, err := wire.JSONEachMember(b, start, func(key []byte, ks, vs int) (int, error) {
		if cut.Start >= 0 && next < 0 {
			next = ks
		}
		ve, err := wire.JSONValueEnd(b, vs)
		if err != nil {
			return ve, err
		}
		v := b[vs:ve]
		switch {
		case wire.JSONStringIs(key, "loadBalancerClass"):
			if err := sc.once(memberClass, "spec.loadBalancerClass"); err != nil {
				return ve, err
			}
			if prevEnd >= 0 {
				cut = wire.Span{Start: prevEnd, End: ve} // `, "loadBalancerClass":"x"`
			} else {
				cut, first = wire.Span{Start: ks, End: ve}, true // `"loadBalancerClass":"x"` and the comma after it
			}
			if s, ok := wire.Interned(wire.JSONPlainString(v), sc.class); ok {
				sc.s.Class, sc.s.HasClass = s, true
				break
			}
			sc.s.Class, sc.s.HasClass, err = wire.JSONOptionalString(v)
		case wire.JSONStringIs(key, "type"):
			if err := sc.once(memberType, "spec.type"); err != nil {
				return ve, err
			}
			if s, ok := wire.Interned(wire.JSONPlainString(v), TypeLoadBalancer, "ClusterIP", "NodePort"); ok {
				sc.s.Type = s
				break
			}
			sc.s.Type, _, err = wire.JSONOptionalString(v)
		}
		prevEnd = ve
		return ve, err
	})
	if err != nil || cut.Start < 0 {
		return end, err
	}
	if first && next >= 0 {
		cut.End = next
	}
	sc.s.edits = append(sc.s.edits, wire.Edit{Start: cut.Start, End: cut.End})
	return end, nil
}

// Field numbers of the Service's protobuf message (k8s.io/api/core/v1).
const (
	pbServiceMetadata       protowire.Number = 1
	pbServiceSpec           protowire.Number = 2
	pbSpecType              protowire.Number = 4
	pbSpecLoadBalancerClass protowire.Number = 21
)

// protoServiceScanner reads protobuf Service messages, one after the other;
// the service it returns is valid until the next scan.
type protoServiceScanner struct {
	meta  bool
	class string
	s     Service
	// prefixes holds the rewritten spec field headers the edits point to;
	// headers and cuts are scratch space.
	prefixes []byte
	headers  []protoSpecHeader
	cuts     []wire.Span
}

// protoSpecHeader is a spec field's new header: edit is the edit that
// writes it, prefixes[from:to] the header.
type protoSpecHeader struct{ edit, from, to int }

// scan reads a Service message. Repeated embedded messages merge and the
// last scalar wins, as protobuf decoding does; every class field is cut.
func (sc *protoServiceScanner) scan(msg []byte) (*Service, error) {
	sc.s = Service{raw: msg, edits: sc.s.edits[:0]}
	// The edits point into prefixes, which may grow: collect the headers'
	// offsets first and attach them once the message is read.
	sc.prefixes, sc.headers = sc.prefixes[:0], sc.headers[:0]
	err := wire.ProtoFields(msg, func(f wire.ProtoField) error {
		if f.Type != protowire.BytesType {
			return nil
		}
		switch f.Num {
		case pbServiceMetadata:
			return wire.ProtoFields(f.Value, sc.metadataField)
		case pbServiceSpec:
			valueStart := f.End - len(f.Value)
			cuts := sc.cuts[:0]
			cut := 0
			if err := wire.ProtoFields(f.Value, func(s wire.ProtoField) error {
				switch s.Num {
				case pbSpecType:
					if s.Type != protowire.BytesType {
						return fmt.Errorf("%w: spec.type", wire.ErrProto)
					}
					if t, ok := wire.Interned(s.Value, TypeLoadBalancer, "ClusterIP", "NodePort"); ok {
						sc.s.Type = t
					} else {
						sc.s.Type = string(s.Value)
					}
				case pbSpecLoadBalancerClass:
					if s.Type != protowire.BytesType {
						return fmt.Errorf("%w: spec.loadBalancerClass", wire.ErrProto)
					}
					if c, ok := wire.Interned(s.Value, sc.class); ok {
						sc.s.Class = c
					} else {
						sc.s.Class = string(s.Value)
					}
					sc.s.HasClass = true
					cuts = append(cuts, wire.Span{Start: valueStart + s.Start, End: valueStart + s.End})
					cut += s.End - s.Start
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
			sc.prefixes = protowire.AppendVarint(protowire.AppendTag(sc.prefixes, pbServiceSpec, protowire.BytesType), uint64(len(f.Value)-cut))
			sc.headers = append(sc.headers, protoSpecHeader{edit: len(sc.s.edits), from: from, to: len(sc.prefixes)})
			sc.s.edits = append(sc.s.edits, wire.Edit{Start: f.Start, End: valueStart})
			for _, c := range cuts {
				sc.s.edits = append(sc.s.edits, wire.Edit{Start: c.Start, End: c.End})
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, h := range sc.headers {
		sc.s.edits[h.edit].With = sc.prefixes[h.from:h.to]
	}
	return &sc.s, nil
}

func (sc *protoServiceScanner) metadataField(m wire.ProtoField) error {
	if m.Type != protowire.BytesType {
		return nil
	}
	var field *string
	switch m.Num {
	case wire.PbMetaFinalizers:
		if string(m.Value) == LoadBalancerCleanupFinalizer {
			sc.s.Cleanup = true
		}
		return nil
	case wire.PbMetaAnnotations:
		if !sc.meta {
			return nil
		}
		key, value, err := wire.ProtoMapEntry(m.Value)
		if string(key) == initialEventsEndAnnotation {
			sc.s.InitialEventsEnd = string(value) == "true"
		}
		return err
	case wire.PbMetaName:
		field = &sc.s.Name
	case wire.PbMetaNamespace:
		field = &sc.s.Namespace
	case wire.PbMetaUID:
		field = &sc.s.UID
	case wire.PbMetaResourceVersion:
		field = &sc.s.ResourceVersion
	default:
		return nil
	}
	if sc.meta {
		*field = string(m.Value)
	}
	return nil
}
