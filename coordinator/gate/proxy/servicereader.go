package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protowire"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The readers turn the API server's answers into objects, one at a time: a
// ServiceList into its metadata and its Services, a watch into its events.
// They hold one Service (or one event) in memory, never a whole list. What
// happens to each is the caller's decision.

// Limits of what the view holds in memory at once.
const (
	// maxServiceValue bounds one Service (or one watch event); the API
	// server's own limit for an object is far lower.
	maxServiceValue = 32 << 20
	// maxServiceBody bounds a PUT body and a single-Service answer.
	maxServiceBody = 8 << 20
)

// readOne reads a single Service: JSON, or protobuf in its envelope.
func readOne(media mediaKind, body []byte, class string) (*service, error) {
	if media == mediaProtobuf {
		o, err := readProtoObject(body)
		if err != nil {
			return nil, err
		}
		sc := protoServiceScanner{meta: true, class: class}
		return sc.scan(o.raw)
	}
	sc := jsonServiceScanner{meta: true, class: class}
	return sc.scan(body)
}

// listMeta is what the readers take from a list's metadata.
type listMeta struct{ resourceVersion, continueToken string }

// listVisit receives a ServiceList as it is read.
type listVisit struct {
	// begin gets the length of the list message (protobuf; 0 for JSON),
	// before anything else.
	begin func(length uint64) error
	// meta gets the list's metadata, item each Service, in the order the API
	// server wrote them.
	meta func(listMeta) error
	item func(*service) error
}

// Field numbers of ServiceList and ListMeta.
const (
	pbListMeta                protowire.Number = 1
	pbListItems               protowire.Number = 2
	pbListMetaResourceVersion protowire.Number = 2
	pbListMetaContinue        protowire.Number = 3
)

// readList reads a ServiceList in media from in. meta is set on the
// scanner: true reads the Services' names and versions too.
func readList(media mediaKind, in io.Reader, class string, meta bool, v listVisit) error {
	if media == mediaProtobuf {
		return readProtoList(in, &protoServiceScanner{class: class, meta: meta}, v)
	}
	return readJSONList(in, &jsonServiceScanner{class: class, meta: meta}, v)
}

func readJSONList(in io.Reader, sc *jsonServiceScanner, v listVisit) error {
	s := newJSONStream(in, maxServiceValue)
	if err := v.begin(0); err != nil {
		return err
	}
	if err := s.expect('{'); err != nil {
		return err
	}
	for n := 0; ; n++ {
		c, err := s.peek()
		if err != nil {
			return noEOF(err)
		}
		if c == '}' {
			s.off++
			return s.end()
		}
		if n > 0 {
			if err := s.expect(','); err != nil {
				return err
			}
		}
		k, err := s.value()
		if err != nil {
			return err
		}
		key, err := jsonUnquote(k)
		if err != nil {
			return err
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		switch key {
		case "items":
			err = readJSONItems(s, sc, v)
		case "metadata":
			var b []byte
			if b, err = s.value(); err == nil {
				var m listMeta
				if m, err = jsonListMeta(b); err == nil {
					err = v.meta(m)
				}
			}
		default:
			_, err = s.value()
		}
		if err != nil {
			return err
		}
	}
}

func jsonListMeta(b []byte) (listMeta, error) {
	var m listMeta
	if len(b) == 0 || b[0] != '{' {
		return m, nil // null
	}
	_, err := jsonObjectMembers(b, 0, func(mm jsonMember) error {
		var err error
		switch mm.key {
		case "resourceVersion":
			m.resourceVersion, _, err = jsonOptionalString(b[mm.valueStart:mm.valueEnd])
		case "continue":
			m.continueToken, _, err = jsonOptionalString(b[mm.valueStart:mm.valueEnd])
		}
		return err
	})
	return m, err
}

func readJSONItems(s *jsonStream, sc *jsonServiceScanner, v listVisit) error {
	c, err := s.peek()
	if err != nil {
		return noEOF(err)
	}
	if c != '[' {
		_, err := s.value() // null
		return err
	}
	s.off++
	for n := 0; ; n++ {
		c, err := s.peek()
		if err != nil {
			return noEOF(err)
		}
		if c == ']' {
			s.off++
			return nil
		}
		if n > 0 {
			if err := s.expect(','); err != nil {
				return err
			}
		}
		var svc *service
		if _, err := s.scanValue(func(b []byte) (end int, err error) {
			svc, end, err = sc.scanAt(b, 0)
			return end, err
		}); err != nil {
			return fmt.Errorf("Service %d of the list: %w", n, err)
		}
		if err := v.item(svc); err != nil {
			return err
		}
	}
}

func readProtoList(in io.Reader, sc *protoServiceScanner, v listVisit) error {
	s := newProtoStream(in, maxServiceValue)
	if err := s.magic(); err != nil {
		return err
	}
	listSeen := false
	for {
		num, typ, length, _, err := s.header()
		if errors.Is(err, io.EOF) {
			if !listSeen {
				return fmt.Errorf("%w: no list in the envelope", errProto)
			}
			return nil
		}
		if err != nil {
			return err
		}
		switch {
		case typ != protowire.BytesType:
			_, err = s.skip(typ)
		case num == pbUnknownRaw && !listSeen:
			listSeen = true
			if err = v.begin(length); err == nil {
				err = readProtoListMessage(s, length, sc, v)
			}
		case num == pbUnknownRaw:
			err = fmt.Errorf("%w: two lists in the envelope", errProto)
		default:
			_, err = s.bytes(length) // type meta, content encoding and type
		}
		if err != nil {
			return err
		}
	}
}

// readProtoListMessage reads the ServiceList message of length bytes.
func readProtoListMessage(s *protoStream, length uint64, sc *protoServiceScanner, v listVisit) error {
	for read := uint64(0); read < length; {
		num, typ, l, n, err := s.header()
		if err != nil {
			return noEOF(err)
		}
		read += uint64(n)
		if typ != protowire.BytesType {
			return fmt.Errorf("%w: ServiceList field %d of wire type %d", errProto, num, typ)
		}
		b, err := s.bytes(l)
		if err != nil {
			return err
		}
		if read += l; read > length {
			return fmt.Errorf("%w: ServiceList field %d past the end of the list", errProto, num)
		}
		switch num {
		case pbListItems:
			var svc *service
			if svc, err = sc.scan(b); err == nil {
				err = v.item(svc)
			}
		case pbListMeta:
			var m listMeta
			err = protoFields(b, func(f protoField) error {
				switch {
				case f.typ != protowire.BytesType:
				case f.num == pbListMetaResourceVersion:
					m.resourceVersion = string(f.value)
				case f.num == pbListMetaContinue:
					m.continueToken = string(f.value)
				}
				return nil
			})
			if err == nil {
				err = v.meta(m)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Watch event types.
const (
	eventAdded    = "ADDED"
	eventModified = "MODIFIED"
	eventDeleted  = "DELETED"
	eventBookmark = "BOOKMARK"
	eventError    = "ERROR"
)

var watchEventTypes = []string{eventAdded, eventModified, eventDeleted, eventBookmark, eventError}

// watchEvent is one event of a watch as the API server sent it.
type watchEvent struct {
	typ string
	// svc is the object read as a Service (every type but ERROR); valid
	// until the next event is read.
	svc *service
	// status is an ERROR's object.
	status *metav1.Status
}

// eventReader reads a watch of Services event by event.
type eventReader interface {
	// next returns the next event; io.EOF at the clean end of the stream.
	next() (watchEvent, error)
}

func newEventReader(media mediaKind, in io.Reader, class string) eventReader {
	if media == mediaProtobuf {
		return &protoEventReader{s: newProtoStream(in, maxServiceValue), sc: protoServiceScanner{meta: true, class: class}}
	}
	return &jsonEventReader{s: newJSONStream(in, maxServiceValue), sc: jsonServiceScanner{meta: true, class: class}}
}

// jsonEventReader reads a JSON watch: one {"type":…,"object":…} after another.
type jsonEventReader struct {
	s  *jsonStream
	sc jsonServiceScanner
}

func (r *jsonEventReader) next() (watchEvent, error) {
	if _, err := r.s.peek(); err != nil {
		return watchEvent{}, err // io.EOF at the end
	}
	// One pass over the event when its type comes first (the API server
	// writes it first): the object is scanned as a Service as it is found.
	var ev watchEvent
	var obj span
	ev2, err := r.s.scanValue(func(b []byte) (int, error) {
		ev, obj = watchEvent{}, span{-1, -1}
		return jsonEachMember(b, 0, func(key []byte, _, vs int) (int, error) {
			switch {
			case jsonStringIs(key, "type"):
				if ev.typ != "" {
					return vs, fmt.Errorf("%w: type given twice", errJSONSyntax)
				}
				ve, err := jsonValueEnd(b, vs)
				if err != nil {
					return ve, err
				}
				var ok bool
				if ev.typ, ok = interned(jsonPlainString(b[vs:ve]), watchEventTypes...); !ok {
					ev.typ, _, err = jsonOptionalString(b[vs:ve])
				}
				return ve, err
			case jsonStringIs(key, "object"):
				if obj.start >= 0 {
					return vs, fmt.Errorf("%w: object given twice", errJSONSyntax)
				}
				if ev.typ != "" && ev.typ != eventError && b[vs] == '{' {
					svc, ve, err := r.sc.scanAt(b, vs)
					ev.svc, obj = svc, span{vs, ve}
					return ve, err
				}
				ve, err := jsonValueEnd(b, vs)
				obj = span{vs, ve}
				return ve, err
			}
			return jsonValueEnd(b, vs)
		})
	})
	if err != nil {
		return watchEvent{}, fmt.Errorf("watch event: %w", noEOF(err))
	}
	if ev.typ == "" || obj.start < 0 {
		return watchEvent{}, fmt.Errorf("%w: watch event without type or object", errJSONSyntax)
	}
	b := ev2[obj.start:obj.end]
	switch {
	case ev.typ == eventError:
		ev.status = &metav1.Status{}
		if err := json.Unmarshal(b, ev.status); err != nil {
			return watchEvent{}, fmt.Errorf("ERROR event: %w", err)
		}
	case ev.svc == nil:
		// The type came after the object: scan it now.
		if ev.svc, err = r.sc.scan(b); err != nil {
			return watchEvent{}, fmt.Errorf("%s event: %w", ev.typ, err)
		}
	}
	return ev, nil
}

// protoEventReader reads a protobuf watch: frames of a 4-byte length and a
// WatchEvent{1: type, 2: RawExtension{1: the enveloped object}}.
type protoEventReader struct {
	s  *protoStream
	sc protoServiceScanner
}

func (r *protoEventReader) next() (watchEvent, error) {
	frame, err := r.s.frame()
	if err != nil {
		return watchEvent{}, err // io.EOF at the end
	}
	var ev watchEvent
	var object []byte
	if err := protoFields(frame, func(f protoField) error {
		switch {
		case f.typ != protowire.BytesType:
		case f.num == pbWatchEventType:
			var ok bool
			if ev.typ, ok = interned(f.value, watchEventTypes...); !ok {
				ev.typ = string(f.value)
			}
		case f.num == pbWatchEventObject:
			return protoFields(f.value, func(r protoField) error {
				if r.num == pbRawExtensionRaw && r.typ == protowire.BytesType {
					object = r.value
				}
				return nil
			})
		}
		return nil
	}); err != nil {
		return watchEvent{}, fmt.Errorf("watch event: %w", err)
	}
	o, err := readProtoObject(object)
	if err != nil {
		return watchEvent{}, fmt.Errorf("%s event: %w", ev.typ, err)
	}
	if ev.typ == eventError {
		ev.status = &metav1.Status{}
		if err := ev.status.Unmarshal(o.raw); err != nil {
			return watchEvent{}, fmt.Errorf("ERROR event: %w", err)
		}
		return ev, nil
	}
	if ev.svc, err = r.sc.scan(o.raw); err != nil {
		return watchEvent{}, fmt.Errorf("%s event: %w", ev.typ, err)
	}
	return ev, nil
}
