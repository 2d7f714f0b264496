package service

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protowire"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/wire"
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
	// MaxBody bounds a PUT body and a single-Service answer.
	MaxBody = 8 << 20
)

// ReadOne reads a single Service: JSON, or protobuf in its envelope.
func ReadOne(media wire.Media, body []byte, class string) (*Service, error) {
	if media == wire.MediaProtobuf {
		o, err := wire.ReadProtoObject(body)
		if err != nil {
			return nil, err
		}
		sc := protoServiceScanner{meta: true, class: class}
		return sc.scan(o.Raw)
	}
	sc := jsonServiceScanner{meta: true, class: class}
	return sc.scan(body)
}

// ListMeta is what the readers take from a list's metadata.
type ListMeta struct{ ResourceVersion, ContinueToken string }

// ListVisit receives a ServiceList as it is read.
type ListVisit struct {
	// begin gets the length of the list message (protobuf; 0 for JSON),
	// before anything else.
	Begin func(length uint64) error
	// meta gets the list's metadata, item each Service, in the order the API
	// server wrote them.
	Meta func(ListMeta) error
	Item func(*Service) error
}

// Field numbers of ServiceList and ListMeta.
const (
	PbListMeta                protowire.Number = 1
	PbListItems               protowire.Number = 2
	pbListMetaResourceVersion protowire.Number = 2
	pbListMetaContinue        protowire.Number = 3
)

// ReadList reads a ServiceList in media from in. meta is set on the
// scanner: true reads the Services' names and versions too.
func ReadList(media wire.Media, in io.Reader, class string, meta bool, v ListVisit) error {
	if media == wire.MediaProtobuf {
		return readProtoList(in, &protoServiceScanner{class: class, meta: meta}, v)
	}
	return readJSONList(in, &jsonServiceScanner{class: class, meta: meta}, v)
}

func readJSONList(in io.Reader, sc *jsonServiceScanner, v ListVisit) error {
	s := wire.NewJSONStream(in, maxServiceValue)
	if err := v.Begin(0); err != nil {
		return err
	}
	if err := s.Expect('{'); err != nil {
		return err
	}
	for n := 0; ; n++ {
		c, err := s.Peek()
		if err != nil {
			return wire.NoEOF(err)
		}
		if c == '}' {
			s.Off++
			return s.End()
		}
		if n > 0 {
			if err := s.Expect(','); err != nil {
				return err
			}
		}
		k, err := s.Value()
		if err != nil {
			return err
		}
		key, err := wire.JSONUnquote(k)
		if err != nil {
			return err
		}
		if err := s.Expect(':'); err != nil {
			return err
		}
		switch key {
		case "items":
			err = readJSONItems(s, sc, v)
		case "metadata":
			var b []byte
			if b, err = s.Value(); err == nil {
				var m ListMeta
				if m, err = jsonListMeta(b); err == nil {
					err = v.Meta(m)
				}
			}
		default:
			_, err = s.Value()
		}
		if err != nil {
			return err
		}
	}
}

func jsonListMeta(b []byte) (ListMeta, error) {
	var m ListMeta
	if len(b) == 0 || b[0] != '{' {
		return m, nil // null
	}
	_, err := wire.JSONObjectMembers(b, 0, func(mm wire.JSONMember) error {
		var err error
		switch mm.Key {
		case "resourceVersion":
			m.ResourceVersion, _, err = wire.JSONOptionalString(b[mm.ValueStart:mm.ValueEnd])
		case "continue":
			m.ContinueToken, _, err = wire.JSONOptionalString(b[mm.ValueStart:mm.ValueEnd])
		}
		return err
	})
	return m, err
}

func readJSONItems(s *wire.JSONStream, sc *jsonServiceScanner, v ListVisit) error {
	c, err := s.Peek()
	if err != nil {
		return wire.NoEOF(err)
	}
	if c != '[' {
		_, err := s.Value() // null
		return err
	}
	s.Off++
	for n := 0; ; n++ {
		c, err := s.Peek()
		if err != nil {
			return wire.NoEOF(err)
		}
		if c == ']' {
			s.Off++
			return nil
		}
		if n > 0 {
			if err := s.Expect(','); err != nil {
				return err
			}
		}
		var svc *Service
		if _, err := s.ScanValue(func(b []byte) (end int, err error) {
			svc, end, err = sc.scanAt(b, 0)
			return end, err
		}); err != nil {
			return fmt.Errorf("Service %d of the list: %w", n, err)
		}
		if err := v.Item(svc); err != nil {
			return err
		}
	}
}

func readProtoList(in io.Reader, sc *protoServiceScanner, v ListVisit) error {
	s := wire.NewProtoStream(in, maxServiceValue)
	if err := s.Magic(); err != nil {
		return err
	}
	listSeen := false
	for {
		num, typ, length, _, err := s.Header()
		if errors.Is(err, io.EOF) {
			if !listSeen {
				return fmt.Errorf("%w: no list in the envelope", wire.ErrProto)
			}
			return nil
		}
		if err != nil {
			return err
		}
		switch {
		case typ != protowire.BytesType:
			_, err = s.Skip(typ)
		case num == wire.PbUnknownRaw && !listSeen:
			listSeen = true
			if err = v.Begin(length); err == nil {
				err = readProtoListMessage(s, length, sc, v)
			}
		case num == wire.PbUnknownRaw:
			err = fmt.Errorf("%w: two lists in the envelope", wire.ErrProto)
		default:
			_, err = s.Bytes(length) // type meta, content encoding and type
		}
		if err != nil {
			return err
		}
	}
}

// readProtoListMessage reads the ServiceList message of length bytes.
func readProtoListMessage(s *wire.ProtoStream, length uint64, sc *protoServiceScanner, v ListVisit) error {
	for read := uint64(0); read < length; {
		num, typ, l, n, err := s.Header()
		if err != nil {
			return wire.NoEOF(err)
		}
		read += uint64(n)
		if typ != protowire.BytesType {
			return fmt.Errorf("%w: ServiceList field %d of wire type %d", wire.ErrProto, num, typ)
		}
		b, err := s.Bytes(l)
		if err != nil {
			return err
		}
		if read += l; read > length {
			return fmt.Errorf("%w: ServiceList field %d past the end of the list", wire.ErrProto, num)
		}
		switch num {
		case PbListItems:
			var svc *Service
			if svc, err = sc.scan(b); err == nil {
				err = v.Item(svc)
			}
		case PbListMeta:
			var m ListMeta
			err = wire.ProtoFields(b, func(f wire.ProtoField) error {
				switch {
				case f.Type != protowire.BytesType:
				case f.Num == pbListMetaResourceVersion:
					m.ResourceVersion = string(f.Value)
				case f.Num == pbListMetaContinue:
					m.ContinueToken = string(f.Value)
				}
				return nil
			})
			if err == nil {
				err = v.Meta(m)
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
	EventAdded    = "ADDED"
	EventModified = "MODIFIED"
	EventDeleted  = "DELETED"
	EventBookmark = "BOOKMARK"
	EventError    = "ERROR"
)

var watchEventTypes = []string{EventAdded, EventModified, EventDeleted, EventBookmark, EventError}

// WatchEvent is one event of a watch as the API server sent it.
type WatchEvent struct {
	Type string
	// svc is the object read as a Service (every type but ERROR); valid
	// until the next event is read.
	Service *Service
	// status is an ERROR's object.
	Status *metav1.Status
}

// EventReader reads a watch of Services event by event.
type EventReader interface {
	// Next returns the next event; io.EOF at the clean end of the stream.
	Next() (WatchEvent, error)
}

func NewEventReader(media wire.Media, in io.Reader, class string) EventReader {
	if media == wire.MediaProtobuf {
		return &protoEventReader{s: wire.NewProtoStream(in, maxServiceValue), sc: protoServiceScanner{meta: true, class: class}}
	}
	return &jsonEventReader{s: wire.NewJSONStream(in, maxServiceValue), sc: jsonServiceScanner{meta: true, class: class}}
}

// jsonEventReader reads a JSON watch: one {"type":…,"object":…} after another.
type jsonEventReader struct {
	s  *wire.JSONStream
	sc jsonServiceScanner
}

func (r *jsonEventReader) Next() (WatchEvent, error) {
	if _, err := r.s.Peek(); err != nil {
		return WatchEvent{}, err // io.EOF at the end
	}
	// One pass over the event when its type comes first (the API server
	// writes it first): the object is scanned as a Service as it is found.
	var ev WatchEvent
	var obj wire.Span
	ev2, err := r.s.ScanValue(func(b []byte) (int, error) {
		ev, obj = WatchEvent{}, wire.Span{Start: -1, End: -1}
		return wire.JSONEachMember(b, 0, func(key []byte, _, vs int) (int, error) {
			switch {
			case wire.JSONStringIs(key, "type"):
				if ev.Type != "" {
					return vs, fmt.Errorf("%w: type given twice", wire.ErrJSONSyntax)
				}
				ve, err := wire.JSONValueEnd(b, vs)
				if err != nil {
					return ve, err
				}
				var ok bool
				if ev.Type, ok = wire.Interned(wire.JSONPlainString(b[vs:ve]), watchEventTypes...); !ok {
					ev.Type, _, err = wire.JSONOptionalString(b[vs:ve])
				}
				return ve, err
			case wire.JSONStringIs(key, "object"):
				if obj.Start >= 0 {
					return vs, fmt.Errorf("%w: object given twice", wire.ErrJSONSyntax)
				}
				if ev.Type != "" && ev.Type != EventError && b[vs] == '{' {
					svc, ve, err := r.sc.scanAt(b, vs)
					ev.Service, obj = svc, wire.Span{Start: vs, End: ve}
					return ve, err
				}
				ve, err := wire.JSONValueEnd(b, vs)
				obj = wire.Span{Start: vs, End: ve}
				return ve, err
			}
			return wire.JSONValueEnd(b, vs)
		})
	})
	if err != nil {
		return WatchEvent{}, fmt.Errorf("watch event: %w", wire.NoEOF(err))
	}
	if ev.Type == "" || obj.Start < 0 {
		return WatchEvent{}, fmt.Errorf("%w: watch event without type or object", wire.ErrJSONSyntax)
	}
	b := ev2[obj.Start:obj.End]
	switch {
	case ev.Type == EventError:
		ev.Status = &metav1.Status{}
		if err := json.Unmarshal(b, ev.Status); err != nil {
			return WatchEvent{}, fmt.Errorf("ERROR event: %w", err)
		}
	case ev.Service == nil:
		// The type came after the object: scan it now.
		if ev.Service, err = r.sc.scan(b); err != nil {
			return WatchEvent{}, fmt.Errorf("%s event: %w", ev.Type, err)
		}
	}
	return ev, nil
}

// protoEventReader reads a protobuf watch: frames of a 4-byte length and a
// WatchEvent{1: type, 2: RawExtension{1: the enveloped object}}.
type protoEventReader struct {
	s  *wire.ProtoStream
	sc protoServiceScanner
}

func (r *protoEventReader) Next() (WatchEvent, error) {
	frame, err := r.s.Frame()
	if err != nil {
		return WatchEvent{}, err // io.EOF at the end
	}
	var ev WatchEvent
	var object []byte
	if err := wire.ProtoFields(frame, func(f wire.ProtoField) error {
		switch {
		case f.Type != protowire.BytesType:
		case f.Num == wire.PbWatchEventType:
			var ok bool
			if ev.Type, ok = wire.Interned(f.Value, watchEventTypes...); !ok {
				ev.Type = string(f.Value)
			}
		case f.Num == wire.PbWatchEventObject:
			return wire.ProtoFields(f.Value, func(r wire.ProtoField) error {
				if r.Num == wire.PbRawExtensionRaw && r.Type == protowire.BytesType {
					object = r.Value
				}
				return nil
			})
		}
		return nil
	}); err != nil {
		return WatchEvent{}, fmt.Errorf("watch event: %w", err)
	}
	o, err := wire.ReadProtoObject(object)
	if err != nil {
		return WatchEvent{}, fmt.Errorf("%s event: %w", ev.Type, err)
	}
	if ev.Type == EventError {
		ev.Status = &metav1.Status{}
		if err := ev.Status.Unmarshal(o.Raw); err != nil {
			return WatchEvent{}, fmt.Errorf("ERROR event: %w", err)
		}
		return ev, nil
	}
	if ev.Service, err = r.sc.scan(o.Raw); err != nil {
		return WatchEvent{}, fmt.Errorf("%s event: %w", ev.Type, err)
	}
	return ev, nil
}
