package wire

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
// json.go): the fields of a message, the envelope of an object, and a
// stream of fields or watch frames. Nothing is decoded into objects.
//
//	object    = "k8s\x00" Unknown
//	Unknown   = 1: TypeMeta{1: apiVersion, 2: kind}, 2: raw (the object's message), 3, 4: strings
//	watch     = frames of a 4-byte big-endian length and a WatchEvent{1: type, 2: RawExtension{1: raw object}}

// ProtoMagic starts every protobuf-encoded Kubernetes object.
var ProtoMagic = []byte{0x6b, 0x38, 0x73, 0x00}

// Field numbers of the envelopes (k8s.io/apimachinery runtime.Unknown,
// runtime.TypeMeta, metav1.WatchEvent, runtime.RawExtension).
const (
	pbUnknownTypeMeta  protowire.Number = 1
	PbUnknownRaw       protowire.Number = 2
	pbTypeMetaVersion  protowire.Number = 1
	pbTypeMetaKind     protowire.Number = 2
	PbWatchEventType   protowire.Number = 1
	PbWatchEventObject protowire.Number = 2
	PbRawExtensionRaw  protowire.Number = 1
)

// Field numbers of ObjectMeta (k8s.io/apimachinery metav1), which every
// object's message holds as its field 1.
const (
	PbMetaName            protowire.Number = 1
	PbMetaNamespace       protowire.Number = 3
	PbMetaUID             protowire.Number = 5
	PbMetaResourceVersion protowire.Number = 6
	PbMetaLabels          protowire.Number = 11
	PbMetaAnnotations     protowire.Number = 12
	PbMetaFinalizers      protowire.Number = 14
)

// AppendProtoTypeMeta appends the envelope's TypeMeta field for a v1 kind.
func AppendProtoTypeMeta(dst []byte, kind string) []byte {
	dst = protowire.AppendTag(dst, pbUnknownTypeMeta, protowire.BytesType)
	dst = protowire.AppendVarint(dst, uint64(protowire.SizeTag(pbTypeMetaVersion)+protowire.SizeBytes(2)+protowire.SizeTag(pbTypeMetaKind)+protowire.SizeBytes(len(kind))))
	dst = protowire.AppendString(protowire.AppendTag(dst, pbTypeMetaVersion, protowire.BytesType), "v1")
	return protowire.AppendString(protowire.AppendTag(dst, pbTypeMetaKind, protowire.BytesType), kind)
}

// AppendProtoWatchEvent appends a WatchEvent message of type typ carrying
// object (an enveloped object, magic included).
func AppendProtoWatchEvent(dst []byte, typ string, object []byte) []byte {
	dst = protowire.AppendString(protowire.AppendTag(dst, PbWatchEventType, protowire.BytesType), typ)
	dst = protowire.AppendTag(dst, PbWatchEventObject, protowire.BytesType)
	dst = protowire.AppendVarint(dst, uint64(protowire.SizeTag(PbRawExtensionRaw)+protowire.SizeBytes(len(object))))
	return protowire.AppendBytes(protowire.AppendTag(dst, PbRawExtensionRaw, protowire.BytesType), object)
}

var ErrProto = errors.New("malformed protobuf")

// ProtoField is one field of a message: b[start:end] is its tag and value.
type ProtoField struct {
	Num        protowire.Number
	Type       protowire.Type
	Start, End int
	// value is the payload of a length-delimited field.
	Value []byte
}

// ProtoFields calls fn for every field of msg, in order.
func ProtoFields(msg []byte, fn func(f ProtoField) error) error {
	for i := 0; i < len(msg); {
		num, typ, n := protowire.ConsumeTag(msg[i:])
		if n < 0 {
			return fmt.Errorf("%w: %v", ErrProto, protowire.ParseError(n))
		}
		f := ProtoField{Num: num, Type: typ, Start: i}
		if typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(msg[i+n:])
			if m < 0 {
				return fmt.Errorf("%w: %v", ErrProto, protowire.ParseError(m))
			}
			f.Value = v
			n += m
		} else {
			m := protowire.ConsumeFieldValue(num, typ, msg[i+n:])
			if m < 0 {
				return fmt.Errorf("%w: %v", ErrProto, protowire.ParseError(m))
			}
			n += m
		}
		f.End = i + n
		if err := fn(f); err != nil {
			return err
		}
		i = f.End
	}
	return nil
}

// protoString reads a string field's value.
// ProtoMapEntry reads an entry of a protobuf map<string, string> (a label
// or an annotation): field 1 is the key, field 2 the value; fields of
// another wire type are skipped. The slices alias entry.
func ProtoMapEntry(entry []byte) (key, value []byte, err error) {
	err = ProtoFields(entry, func(e ProtoField) error {
		switch {
		case e.Type != protowire.BytesType:
		case e.Num == 1:
			key = e.Value
		case e.Num == 2:
			value = e.Value
		}
		return nil
	})
	return key, value, err
}

func protoString(f ProtoField) (string, error) {
	if f.Type != protowire.BytesType {
		return "", fmt.Errorf("%w: field %d is not a string", ErrProto, f.Num)
	}
	return string(f.Value), nil
}

// ProtoEdit rebuilds msg: every length-delimited field num is replaced by what
// Edit returns for its value (drop: removed). It returns msg itself when
// nothing changed.
func ProtoEdit(msg []byte, num protowire.Number, fn func(v []byte) (out []byte, drop, changed bool, err error)) ([]byte, error) {
	var out []byte
	at := 0
	err := ProtoFields(msg, func(f ProtoField) error {
		if f.Num != num || f.Type != protowire.BytesType {
			return nil
		}
		v, drop, changed, err := fn(f.Value)
		if err != nil || !changed {
			return err
		}
		if out == nil {
			out = make([]byte, 0, len(msg))
		}
		out = append(out, msg[at:f.Start]...)
		if !drop {
			out = protowire.AppendTag(out, num, protowire.BytesType)
			out = protowire.AppendBytes(out, v)
		}
		at = f.End
		return nil
	})
	if err != nil || out == nil {
		return msg, err
	}
	return append(out, msg[at:]...), nil
}

// ProtoObject is an object in its Unknown envelope.
type ProtoObject struct {
	Kind string
	// raw is the object's own message.
	Raw []byte
}

// ReadProtoObject unwraps "k8s\x00" Unknown.
func ReadProtoObject(b []byte) (ProtoObject, error) {
	if !bytes.HasPrefix(b, ProtoMagic) {
		return ProtoObject{}, fmt.Errorf("%w: no magic prefix", ErrProto)
	}
	var o ProtoObject
	err := ProtoFields(b[len(ProtoMagic):], func(f ProtoField) error {
		switch {
		case f.Num == pbUnknownTypeMeta && f.Type == protowire.BytesType:
			return ProtoFields(f.Value, func(t ProtoField) error {
				if t.Num == pbTypeMetaKind {
					k, err := protoString(t)
					o.Kind = k
					return err
				}
				return nil
			})
		case f.Num == PbUnknownRaw && f.Type == protowire.BytesType:
			o.Raw = f.Value
		}
		return nil
	})
	return o, err
}

// RewrapProtoObject returns b (an enveloped object) with its raw message
// replaced by raw.
func RewrapProtoObject(b, raw []byte) ([]byte, error) {
	if !bytes.HasPrefix(b, ProtoMagic) {
		return nil, fmt.Errorf("%w: no magic prefix", ErrProto)
	}
	inner, err := ProtoEdit(b[len(ProtoMagic):], PbUnknownRaw, func([]byte) ([]byte, bool, bool, error) { return raw, false, true, nil })
	if err != nil {
		return nil, err
	}
	return append(append(make([]byte, 0, len(ProtoMagic)+len(inner)), ProtoMagic...), inner...), nil
}

// ProtoStream reads a protobuf message field by field from a stream, holding
// one field's value at a time.
type ProtoStream struct {
	r *bufio.Reader
	// max bounds one value.
	max int
	buf []byte
}

func NewProtoStream(r io.Reader, max int) *ProtoStream {
	return &ProtoStream{r: bufio.NewReaderSize(r, 64<<10), max: max}
}

// Magic consumes the object prefix.
func (s *ProtoStream) Magic() error {
	var m [4]byte
	if _, err := io.ReadFull(s.r, m[:]); err != nil {
		return NoEOF(err)
	}
	if !bytes.Equal(m[:], ProtoMagic) {
		return fmt.Errorf("%w: no magic prefix", ErrProto)
	}
	return nil
}

// Header reads a field's tag and, for a length-delimited field, its length;
// io.EOF at the clean end of the stream. n counts the bytes read.
func (s *ProtoStream) Header() (num protowire.Number, typ protowire.Type, length uint64, n int, err error) {
	tag, tn, err := s.varint()
	if err != nil {
		return 0, 0, 0, tn, err
	}
	num, typ = protowire.DecodeTag(tag)
	if num < protowire.MinValidNumber {
		return 0, 0, 0, tn, fmt.Errorf("%w: field number %d", ErrProto, num)
	}
	if typ != protowire.BytesType {
		return num, typ, 0, tn, nil
	}
	length, ln, err := s.varint()
	if err != nil {
		return 0, 0, 0, tn + ln, NoEOF(err)
	}
	return num, typ, length, tn + ln, nil
}

func (s *ProtoStream) varint() (uint64, int, error) {
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
	return 0, binary.MaxVarintLen64, fmt.Errorf("%w: varint too long", ErrProto)
}

// Bytes reads length bytes; the slice is valid until the next call. The
// buffer grows as the bytes arrive, not by the length the stream claims.
func (s *ProtoStream) Bytes(length uint64) ([]byte, error) {
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
			return nil, NoEOF(err)
		}
	}
	return s.buf, nil
}

// Skip discards a field's value of a non-length-delimited type.
func (s *ProtoStream) Skip(typ protowire.Type) (int, error) {
	switch typ {
	case protowire.VarintType:
		_, n, err := s.varint()
		return n, NoEOF(err)
	case protowire.Fixed32Type:
		n, err := s.r.Discard(4)
		return n, NoEOF(err)
	case protowire.Fixed64Type:
		n, err := s.r.Discard(8)
		return n, NoEOF(err)
	default:
		return 0, fmt.Errorf("%w: wire type %d", ErrProto, typ)
	}
}

// Frame reads one length-delimited watch frame; io.EOF at the clean end.
func (s *ProtoStream) Frame() ([]byte, error) {
	var l [4]byte
	if _, err := io.ReadFull(s.r, l[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		return nil, NoEOF(err)
	}
	return s.Bytes(uint64(binary.BigEndian.Uint32(l[:])))
}
