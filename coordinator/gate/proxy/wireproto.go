package proxy

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protowire"
)

// The Kubernetes protobuf encoding at the wire level (as the JSON is, see
// wirejson.go): the fields of a message, the envelope of an object, and a
// stream of fields or watch frames. Nothing is decoded into objects.
//
//	object    = "k8s\x00" Unknown
//	Unknown   = 1: TypeMeta{1: apiVersion, 2: kind}, 2: raw (the object's message), 3, 4: strings
//	watch     = frames of a 4-byte big-endian length and a WatchEvent{1: type, 2: RawExtension{1: raw object}}

// protoMagic starts every protobuf-encoded Kubernetes object.
var protoMagic = []byte{0x6b, 0x38, 0x73, 0x00}

// Field numbers of the envelopes (k8s.io/apimachinery runtime.Unknown,
// runtime.TypeMeta, metav1.WatchEvent, runtime.RawExtension).
const (
	pbUnknownTypeMeta  protowire.Number = 1
	pbUnknownRaw       protowire.Number = 2
	pbTypeMetaVersion  protowire.Number = 1
	pbTypeMetaKind     protowire.Number = 2
	pbWatchEventType   protowire.Number = 1
	pbWatchEventObject protowire.Number = 2
	pbRawExtensionRaw  protowire.Number = 1
)

// appendProtoTypeMeta appends the envelope's TypeMeta field for a v1 kind.
func appendProtoTypeMeta(dst []byte, kind string) []byte {
	dst = protowire.AppendTag(dst, pbUnknownTypeMeta, protowire.BytesType)
	dst = protowire.AppendVarint(dst, uint64(protowire.SizeTag(pbTypeMetaVersion)+protowire.SizeBytes(2)+protowire.SizeTag(pbTypeMetaKind)+protowire.SizeBytes(len(kind))))
	dst = protowire.AppendString(protowire.AppendTag(dst, pbTypeMetaVersion, protowire.BytesType), "v1")
	return protowire.AppendString(protowire.AppendTag(dst, pbTypeMetaKind, protowire.BytesType), kind)
}

// appendProtoWatchEvent appends a WatchEvent message of type typ carrying
// object (an enveloped object, magic included).
func appendProtoWatchEvent(dst []byte, typ string, object []byte) []byte {
	dst = protowire.AppendString(protowire.AppendTag(dst, pbWatchEventType, protowire.BytesType), typ)
	dst = protowire.AppendTag(dst, pbWatchEventObject, protowire.BytesType)
	dst = protowire.AppendVarint(dst, uint64(protowire.SizeTag(pbRawExtensionRaw)+protowire.SizeBytes(len(object))))
	return protowire.AppendBytes(protowire.AppendTag(dst, pbRawExtensionRaw, protowire.BytesType), object)
}

var errProto = errors.New("malformed protobuf")

// protoField is one field of a message: b[start:end] is its tag and value.
type protoField struct {
	num        protowire.Number
	typ        protowire.Type
	start, end int
	// value is the payload of a length-delimited field.
	value []byte
}

// protoFields calls fn for every field of msg, in order.
func protoFields(msg []byte, fn func(f protoField) error) error {
	for i := 0; i < len(msg); {
		num, typ, n := protowire.ConsumeTag(msg[i:])
		if n < 0 {
			return fmt.Errorf("%w: %v", errProto, protowire.ParseError(n))
		}
		f := protoField{num: num, typ: typ, start: i}
		if typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(msg[i+n:])
			if m < 0 {
				return fmt.Errorf("%w: %v", errProto, protowire.ParseError(m))
			}
			f.value = v
			n += m
		} else {
			m := protowire.ConsumeFieldValue(num, typ, msg[i+n:])
			if m < 0 {
				return fmt.Errorf("%w: %v", errProto, protowire.ParseError(m))
			}
			n += m
		}
		f.end = i + n
		if err := fn(f); err != nil {
			return err
		}
		i = f.end
	}
	return nil
}

// protoString reads a string field's value.
func protoString(f protoField) (string, error) {
	if f.typ != protowire.BytesType {
		return "", fmt.Errorf("%w: field %d is not a string", errProto, f.num)
	}
	return string(f.value), nil
}

// protoEdit rebuilds msg: every length-delimited field num is replaced by what
// edit returns for its value (drop: removed). It returns msg itself when
// nothing changed.
func protoEdit(msg []byte, num protowire.Number, fn func(v []byte) (out []byte, drop, changed bool, err error)) ([]byte, error) {
	var out []byte
	at := 0
	err := protoFields(msg, func(f protoField) error {
		if f.num != num || f.typ != protowire.BytesType {
			return nil
		}
		v, drop, changed, err := fn(f.value)
		if err != nil || !changed {
			return err
		}
		if out == nil {
			out = make([]byte, 0, len(msg))
		}
		out = append(out, msg[at:f.start]...)
		if !drop {
			out = protowire.AppendTag(out, num, protowire.BytesType)
			out = protowire.AppendBytes(out, v)
		}
		at = f.end
		return nil
	})
	if err != nil || out == nil {
		return msg, err
	}
	return append(out, msg[at:]...), nil
}

// protoObject is an object in its Unknown envelope.
type protoObject struct {
	kind string
	// raw is the object's own message.
	raw []byte
}

// readProtoObject unwraps "k8s\x00" Unknown.
func readProtoObject(b []byte) (protoObject, error) {
	if !bytes.HasPrefix(b, protoMagic) {
		return protoObject{}, fmt.Errorf("%w: no magic prefix", errProto)
	}
	var o protoObject
	err := protoFields(b[len(protoMagic):], func(f protoField) error {
		switch {
		case f.num == pbUnknownTypeMeta && f.typ == protowire.BytesType:
			return protoFields(f.value, func(t protoField) error {
				if t.num == pbTypeMetaKind {
					k, err := protoString(t)
					o.kind = k
					return err
				}
				return nil
			})
		case f.num == pbUnknownRaw && f.typ == protowire.BytesType:
			o.raw = f.value
		}
		return nil
	})
	return o, err
}

// rewrapProtoObject returns b (an enveloped object) with its raw message
// replaced by raw.
func rewrapProtoObject(b, raw []byte) ([]byte, error) {
	if !bytes.HasPrefix(b, protoMagic) {
		return nil, fmt.Errorf("%w: no magic prefix", errProto)
	}
	inner, err := protoEdit(b[len(protoMagic):], pbUnknownRaw, func([]byte) ([]byte, bool, bool, error) { return raw, false, true, nil })
	if err != nil {
		return nil, err
	}
	return append(append(make([]byte, 0, len(protoMagic)+len(inner)), protoMagic...), inner...), nil
}

// protoStream reads a protobuf message field by field from a stream, holding
// one field's value at a time.
type protoStream struct {
	r *bufio.Reader
	// max bounds one value.
	max int
	buf []byte
}

func newProtoStream(r io.Reader, max int) *protoStream {
	return &protoStream{r: bufio.NewReaderSize(r, 64<<10), max: max}
}

// magic consumes the object prefix.
func (s *protoStream) magic() error {
	var m [4]byte
	if _, err := io.ReadFull(s.r, m[:]); err != nil {
		return noEOF(err)
	}
	if !bytes.Equal(m[:], protoMagic) {
		return fmt.Errorf("%w: no magic prefix", errProto)
	}
	return nil
}

// header reads a field's tag and, for a length-delimited field, its length;
// io.EOF at the clean end of the stream. n counts the bytes read.
func (s *protoStream) header() (num protowire.Number, typ protowire.Type, length uint64, n int, err error) {
	tag, tn, err := s.varint()
	if err != nil {
		return 0, 0, 0, tn, err
	}
	num, typ = protowire.DecodeTag(tag)
	if num < protowire.MinValidNumber {
		return 0, 0, 0, tn, fmt.Errorf("%w: field number %d", errProto, num)
	}
	if typ != protowire.BytesType {
		return num, typ, 0, tn, nil
	}
	length, ln, err := s.varint()
	if err != nil {
		return 0, 0, 0, tn + ln, noEOF(err)
	}
	return num, typ, length, tn + ln, nil
}

func (s *protoStream) varint() (uint64, int, error) {
	var v uint64
	for i := 0; i < binary.MaxVarintLen64; i++ {
		c, err := s.r.ReadByte()
		if err != nil {
			if i > 0 {
				return 0, i, io.ErrUnexpectedEOF
			}
			return 0, 0, err
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return v, i + 1, nil
		}
	}
	return 0, binary.MaxVarintLen64, fmt.Errorf("%w: varint too long", errProto)
}

// bytes reads length bytes; the slice is valid until the next call. The
// buffer grows as the bytes arrive, not by the length the stream claims.
func (s *protoStream) bytes(length uint64) ([]byte, error) {
	if length > uint64(s.max) {
		return nil, fmt.Errorf("a protobuf field of %d bytes (more than %d)", length, s.max)
	}
	s.buf = s.buf[:0]
	for uint64(len(s.buf)) < length {
		chunk := min(int(length)-len(s.buf), 1<<20)
		if cap(s.buf)-len(s.buf) < chunk {
			grown := make([]byte, len(s.buf), max(2*cap(s.buf), len(s.buf)+chunk))
			copy(grown, s.buf)
			s.buf = grown
		}
		n, err := io.ReadFull(s.r, s.buf[len(s.buf):len(s.buf)+chunk])
		s.buf = s.buf[:len(s.buf)+n]
		if err != nil {
			return nil, noEOF(err)
		}
	}
	return s.buf, nil
}

// skip discards a field's value of a non-length-delimited type.
func (s *protoStream) skip(typ protowire.Type) (int, error) {
	switch typ {
	case protowire.VarintType:
		_, n, err := s.varint()
		return n, noEOF(err)
	case protowire.Fixed32Type:
		n, err := s.r.Discard(4)
		return n, noEOF(err)
	case protowire.Fixed64Type:
		n, err := s.r.Discard(8)
		return n, noEOF(err)
	default:
		return 0, fmt.Errorf("%w: wire type %d", errProto, typ)
	}
}

// frame reads one length-delimited watch frame; io.EOF at the clean end.
func (s *protoStream) frame() ([]byte, error) {
	var l [4]byte
	if _, err := io.ReadFull(s.r, l[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		return nil, noEOF(err)
	}
	return s.bytes(uint64(binary.BigEndian.Uint32(l[:])))
}
