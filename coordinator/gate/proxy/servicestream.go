package proxy

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"

	"google.golang.org/protobuf/encoding/protowire"
)

// filterJSONList copies a JSON ServiceList with only the Services in the view,
// each without its class, reading and writing one Service at a time.
func (p *Proxy) filterJSONList(in io.Reader, out *bufio.Writer) error {
	s := newJSONStream(in, maxServiceValue)
	if err := s.expect('{'); err != nil {
		return err
	}
	_ = out.WriteByte('{')
	for n := 0; ; n++ {
		c, err := s.peek()
		if err != nil {
			return noEOF(err)
		}
		if c == '}' {
			s.off++
			break
		}
		if n > 0 {
			if err := s.expect(','); err != nil {
				return err
			}
			_ = out.WriteByte(',')
		}
		k, err := s.value()
		if err != nil {
			return err
		}
		key, err := jsonUnquote(k)
		if err != nil {
			return err
		}
		_, _ = out.Write(k)
		if err := s.expect(':'); err != nil {
			return err
		}
		_ = out.WriteByte(':')
		switch key {
		case "items":
			err = p.filterJSONItems(s, out)
		case "metadata":
			var v []byte
			if v, err = s.value(); err == nil {
				v, err = jsonListMetaWithoutCount(v)
				_, _ = out.Write(v)
			}
		default:
			var v []byte
			if v, err = s.value(); err == nil {
				_, _ = out.Write(v)
			}
		}
		if err != nil {
			return err
		}
	}
	_ = out.WriteByte('}')
	return s.end()
}

func (p *Proxy) filterJSONItems(s *jsonStream, out *bufio.Writer) error {
	c, err := s.peek()
	if err != nil {
		return noEOF(err)
	}
	if c != '[' {
		v, err := s.value() // null
		_, _ = out.Write(v)
		return err
	}
	s.off++
	_ = out.WriteByte('[')
	sc := jsonServiceScan{class: p.serviceView.class}
	written := 0
	for n := 0; ; n++ {
		c, err := s.peek()
		if err != nil {
			return noEOF(err)
		}
		if c == ']' {
			s.off++
			break
		}
		if n > 0 {
			if err := s.expect(','); err != nil {
				return err
			}
		}
		item, err := s.scanValue(func(b []byte) (int, error) { return sc.scanObject(b, 0) })
		if err != nil {
			return fmt.Errorf("Service %d of the list: %w", n, err)
		}
		if !p.serviceView.shows(sc.facts) {
			continue
		}
		if written > 0 {
			_ = out.WriteByte(',')
		}
		written++
		if err := sc.write(out, item); err != nil {
			return err
		}
	}
	return out.WriteByte(']')
}

// protoListBuffer is how much of a protobuf list's answer the gate holds
// before it streams the rest (see filterProtoListMessage).
var protoListBuffer = 1 << 20

// pbListPadding is the ServiceList field that pads a streamed answer to the
// length announced before the Services were filtered. ServiceList has fields
// 1 and 2; a decoder skips a field it does not know.
const pbListPadding protowire.Number = 15

// filterProtoList copies a protobuf ServiceList with only the Services in the
// view, each without its class, reading one Service at a time.
func (p *Proxy) filterProtoList(in io.Reader, out *bufio.Writer) error {
	s := newProtoStream(in, maxServiceValue)
	if err := s.magic(); err != nil {
		return err
	}
	_, _ = out.Write(protoMagic)
	var field []byte
	for {
		num, typ, length, _, err := s.header()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if typ != protowire.BytesType {
			return fmt.Errorf("%w: list envelope field %d of wire type %d", errProto, num, typ)
		}
		if num == pbUnknownRaw {
			if err := p.filterProtoListMessage(s, length, out); err != nil {
				return err
			}
			continue
		}
		v, err := s.bytes(length)
		if err != nil {
			return err
		}
		field = protowire.AppendVarint(protowire.AppendTag(field[:0], num, protowire.BytesType), uint64(len(v)))
		_, _ = out.Write(field)
		if _, err := out.Write(v); err != nil {
			return err
		}
	}
}

// filterProtoListMessage copies the ServiceList message of length bytes, as
// the raw field of the envelope, with only the Services in the view.
//
// Its length comes before it, and is known only once every Service has been
// read. Up to protoListBuffer the gate holds the answer and sends it with its
// exact length (a CCM usually sees a small part of a cluster's Services).
// Beyond, it announces the list's own length, streams the Services as it
// reads them, and fills the difference with padding (field 15, zeros) that
// every protobuf decoder skips: the gate never holds more than one Service
// plus the buffer, however many Services the cluster has.
func (p *Proxy) filterProtoListMessage(s *protoStream, length uint64, out *bufio.Writer) error {
	buf := make([]byte, 0, min(length, uint64(protoListBuffer)))
	var item []byte
	streaming := false
	written := uint64(0)
	emit := func(b []byte) error {
		if streaming {
			written += uint64(len(b))
			_, err := out.Write(b)
			return err
		}
		buf = append(buf, b...)
		if len(buf) <= protoListBuffer {
			return nil
		}
		streaming = true
		_, _ = out.Write(protowire.AppendVarint(protowire.AppendTag(nil, pbUnknownRaw, protowire.BytesType), length))
		written = uint64(len(buf))
		_, err := out.Write(buf)
		buf = nil
		return err
	}
	sc := protoServiceScan{class: p.serviceView.class}
	for read := uint64(0); read < length; {
		num, typ, l, n, err := s.header()
		if err != nil {
			return noEOF(err)
		}
		read += uint64(n)
		if typ != protowire.BytesType {
			return fmt.Errorf("%w: ServiceList field %d of wire type %d", errProto, num, typ)
		}
		v, err := s.bytes(l)
		if err != nil {
			return err
		}
		read += l
		if read > length {
			return fmt.Errorf("%w: ServiceList field %d past the end of the list", errProto, num)
		}
		switch num {
		case pbListItems:
			if err := sc.scan(v); err != nil {
				return err
			}
			if !p.serviceView.shows(sc.facts) {
				continue
			}
			item = protowire.AppendTag(item[:0], num, protowire.BytesType)
			item = protowire.AppendVarint(item, uint64(sc.strippedLen(v)))
			item = sc.appendStripped(item, v)
		case pbListMeta:
			if v, err = protoDrop(v, pbListRemainingItemCount); err != nil {
				return err
			}
			fallthrough
		default:
			item = protowire.AppendBytes(protowire.AppendTag(item[:0], num, protowire.BytesType), v)
		}
		if err := emit(item); err != nil {
			return err
		}
	}
	if !streaming {
		_, _ = out.Write(protowire.AppendVarint(protowire.AppendTag(nil, pbUnknownRaw, protowire.BytesType), uint64(len(buf))))
		_, err := out.Write(buf)
		return err
	}
	return writeProtoPadding(out, length-written)
}

// writeProtoPadding writes fields pbListPadding of exactly n bytes in all
// (n is never 1: every edit of a list removes at least two bytes).
func writeProtoPadding(out *bufio.Writer, n uint64) error {
	var zeros [4096]byte
	for n > 0 {
		if n == 1 {
			return errors.New("a padding of one byte")
		}
		// One byte of tag, the length, the zeros; never leave a single byte.
		v := n - 2
		for 1+uint64(protowire.SizeVarint(v))+v > n {
			v--
		}
		if n-(1+uint64(protowire.SizeVarint(v))+v) == 1 {
			v--
		}
		_, _ = out.Write(protowire.AppendVarint(protowire.AppendTag(nil, pbListPadding, protowire.BytesType), v))
		for left := v; left > 0; {
			k := min(left, uint64(len(zeros)))
			if _, err := out.Write(zeros[:k]); err != nil {
				return err
			}
			left -= k
		}
		n -= 1 + uint64(protowire.SizeVarint(v)) + v
	}
	return nil
}

// Watch event types.
const (
	eventAdded    = "ADDED"
	eventModified = "MODIFIED"
	eventDeleted  = "DELETED"
)

// watchState follows which Services one watch has shown its client, so that a
// Service that leaves the view is DELETED for the client and one that enters
// it is ADDED, whatever the API server's event says.
type watchState struct {
	view serviceView
	// complete: the watch starts with the initial state (sendInitialEvents,
	// or resourceVersion "" or "0"), so a Service the watch has not shown the
	// client is one the client does not have.
	complete bool
	// since is the resourceVersion a resumed watch starts after (sinceOK:
	// it is a number).
	since   uint64
	sinceOK bool
	// shown are the keys the client has from this watch.
	shown map[string]struct{}
	// known are the keys this watch has had an event for (resumed watches).
	known map[string]struct{}
	// history says whether a Service may have been in the view before the
	// watch began; nil: assume it may.
	history *serviceHistory

	// Scratch space, reused from event to event.
	jsonScan  jsonServiceScan
	protoScan protoServiceScan
	envelope  []byte
	frame     []byte
}

func (p *Proxy) newWatchState(q url.Values) *watchState {
	s := &watchState{view: p.serviceView, history: p.history, shown: map[string]struct{}{}, known: map[string]struct{}{}}
	s.jsonScan = jsonServiceScan{meta: true, class: p.serviceView.class}
	s.protoScan = protoServiceScan{meta: true, class: p.serviceView.class}
	rv := q.Get("resourceVersion")
	_, initialSet := q["sendInitialEvents"]
	switch {
	case queryBool(q, "sendInitialEvents"):
		s.complete = true
	case !initialSet && (rv == "" || rv == "0"):
		s.complete = true
	default:
		s.since, s.sinceOK = parseResourceVersion(rv)
	}
	return s
}

func parseResourceVersion(rv string) (uint64, bool) {
	v, err := strconv.ParseUint(rv, 10, 64)
	return v, err == nil && v > 0
}

// decide maps the API server's event about a Service to the event the client
// gets (send false: none).
func (s *watchState) decide(event string, f serviceFacts) (out string, send bool) {
	key := f.key()
	in := s.view.shows(f)
	_, wasShown := s.shown[key]
	known := s.complete
	if !known {
		_, known = s.known[key]
		s.known[key] = struct{}{}
	}
	if in && event != eventDeleted {
		s.shown[key] = struct{}{}
	} else {
		delete(s.shown, key)
	}
	switch {
	case wasShown && (in || event == eventDeleted):
		return event, true
	case wasShown:
		return eventDeleted, true // it left the view
	case known:
		if in && event != eventDeleted {
			return eventAdded, true // it entered the view
		}
		return "", false
	}
	// A resumed watch's first event about this Service: the client holds it
	// as it was at the watch's resourceVersion.
	switch event {
	case eventAdded:
		return event, in // created since
	case eventDeleted:
		return event, in // its last state is the one the client may hold
	}
	if s.view.showsNone {
		return "", false
	}
	held := true // whether the client may hold it
	if at, ok := parseResourceVersion(f.resourceVersion); ok && s.history != nil && s.sinceOK {
		held = s.history.mayHaveShown(key, s.since, at)
	}
	switch {
	case in && held:
		return event, true
	case in:
		return eventAdded, true // it entered the view
	case held:
		return eventDeleted, true // it may have been in the view: let the client drop it
	}
	return "", false
}

// Watch event types as they appear on the wire, for the events the view
// rewrites.
var watchEventTypes = []string{eventAdded, eventModified, eventDeleted}

// filterJSON filters a JSON watch stream, event by event.
func (s *watchState) filterJSON(in io.Reader, out *bufio.Writer) error {
	js := newJSONStream(in, maxServiceValue)
	for {
		if _, err := js.peek(); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		// One pass over the event: its type, and the object scanned as a
		// Service (a BOOKMARK's too; an ERROR's Status is skipped).
		var typ string
		var obj span
		scanned := false
		ev, err := js.scanValue(func(b []byte) (int, error) {
			typ, obj, scanned = "", span{}, false
			return jsonEachMember(b, 0, func(key []byte, _, vs int) (int, error) {
				switch {
				case jsonStringIs(key, "type"):
					ve, err := jsonValueEnd(b, vs)
					if err != nil {
						return ve, err
					}
					var ok bool
					if typ, ok = interned(jsonPlainString(b[vs:ve]), watchEventTypes...); !ok {
						typ, _, err = jsonOptionalString(b[vs:ve])
					}
					return ve, err
				case jsonStringIs(key, "object"):
					var ve int
					var err error
					if b[vs] == '{' && typ != "" && typ != "ERROR" && typ != "BOOKMARK" {
						ve, err = s.jsonScan.scanObject(b, vs)
						scanned = err == nil
					} else {
						ve, err = jsonValueEnd(b, vs)
					}
					obj = span{vs, ve}
					return ve, err
				}
				return jsonValueEnd(b, vs)
			})
		})
		if err != nil {
			return fmt.Errorf("watch event: %w", err)
		}
		if typ != eventAdded && typ != eventModified && typ != eventDeleted {
			// BOOKMARK and ERROR pass as they are.
			_, _ = out.Write(ev)
			_ = out.WriteByte('\n')
			continue
		}
		if !scanned {
			// The type came after the object (the API server writes it
			// first): scan it now.
			if err := s.jsonScan.scan(ev[obj.start:obj.end]); err != nil {
				return fmt.Errorf("%s event: %w", typ, err)
			}
			for i := range s.jsonScan.edits {
				s.jsonScan.edits[i].start += obj.start
				s.jsonScan.edits[i].end += obj.start
			}
		}
		outType, send := s.decide(typ, s.jsonScan.facts)
		if !send {
			continue
		}
		_, _ = out.WriteString(`{"type":"` + outType + `","object":`)
		at := obj.start
		for _, e := range s.jsonScan.edits {
			_, _ = out.Write(ev[at:e.start])
			_, _ = out.Write(e.with)
			at = e.end
		}
		_, _ = out.Write(ev[at:obj.end])
		if _, err := out.WriteString("}\n"); err != nil {
			return err
		}
	}
}

// filterProto filters a protobuf watch stream, frame by frame.
func (s *watchState) filterProto(in io.Reader, out *bufio.Writer) error {
	ps := newProtoStream(in, maxServiceValue)
	for {
		frame, err := ps.frame()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		typ, object, err := protoWatchEvent(frame)
		if err != nil {
			return err
		}
		if typ == eventAdded || typ == eventModified || typ == eventDeleted {
			if frame, err = s.protoEvent(typ, object, frame); err != nil {
				return err
			}
			if frame == nil {
				continue
			}
		}
		var l [4]byte
		binary.BigEndian.PutUint32(l[:], uint32(len(frame)))
		_, _ = out.Write(l[:])
		if _, err := out.Write(frame); err != nil {
			return err
		}
	}
}

// protoWatchEvent reads a protobuf watch event frame: its type (interned for
// the usual ones) and the bytes of its object (a runtime.Unknown).
func protoWatchEvent(frame []byte) (typ string, object []byte, err error) {
	err = protoFields(frame, func(f protoField) error {
		switch {
		case f.typ != protowire.BytesType:
		case f.num == pbWatchEventType:
			var ok bool
			if typ, ok = interned(f.value, watchEventTypes...); !ok {
				typ = string(f.value)
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
	})
	if err != nil {
		return "", nil, fmt.Errorf("watch event: %w", err)
	}
	return typ, object, nil
}

// protoEvent decides on one Service event and returns the frame to send
// (nil: none): the API server's own when nothing changes.
func (s *watchState) protoEvent(typ string, object, frame []byte) ([]byte, error) {
	o, err := readProtoObject(object)
	if err != nil {
		return nil, fmt.Errorf("%s event: %w", typ, err)
	}
	sc := &s.protoScan
	if err := sc.scan(o.raw); err != nil {
		return nil, fmt.Errorf("%s event: %w", typ, err)
	}
	outType, send := s.decide(typ, sc.facts)
	if !send {
		return nil, nil
	}
	if outType == typ && len(sc.specs) == 0 {
		return frame, nil
	}
	// The object: its envelope with the Service without its class.
	env := append(s.envelope[:0], protoMagic...)
	if err := protoFields(object[len(protoMagic):], func(f protoField) error {
		if f.num == pbUnknownRaw && f.typ == protowire.BytesType {
			env = protowire.AppendTag(env, pbUnknownRaw, protowire.BytesType)
			env = protowire.AppendVarint(env, uint64(sc.strippedLen(o.raw)))
			env = sc.appendStripped(env, o.raw)
			return nil
		}
		env = append(env, object[len(protoMagic)+f.start:len(protoMagic)+f.end]...)
		return nil
	}); err != nil {
		return nil, err
	}
	s.envelope = env
	out := protowire.AppendString(protowire.AppendTag(s.frame[:0], pbWatchEventType, protowire.BytesType), outType)
	out = protowire.AppendTag(out, pbWatchEventObject, protowire.BytesType)
	out = protowire.AppendVarint(out, uint64(protowire.SizeTag(pbRawExtensionRaw)+protowire.SizeBytes(len(env))))
	out = protowire.AppendBytes(protowire.AppendTag(out, pbRawExtensionRaw, protowire.BytesType), env)
	s.frame = out
	return out, nil
}
