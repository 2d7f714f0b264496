package serviceview

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"

	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/service"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/wire"
)

// The emission: the only code that writes Services to the CCM. It writes
// what the decision (view.go, history.go, watch.go) decided and nothing
// else:
//
//   - a Service in the view: the API server's bytes without
//     spec.loadBalancerClass (service.Service.WriteWithoutClass);
//   - a tombstone: a Service of namespace, name, uid and resourceVersion;
//   - a bookmark: a Service of resourceVersion and the initial-events-end
//     annotation;
//   - a Status: status, code, reason and message;
//   - a list's metadata: its resourceVersion.
//
// Tombstones, bookmarks and Statuses are encoded by apimachinery's generated
// code (k8s.io/api/core/v1, metav1): the gate builds them from those fields
// alone.

// listWriter writes a ServiceList of the Services it is given.
type listWriter interface {
	// begin gets the length of the API server's list message (protobuf).
	begin(length uint64) error
	meta(m service.ListMeta) error
	item(s *service.Service) error
	// end completes the list.
	end() error
}

func newListWriter(media wire.Media, out *bufio.Writer) listWriter {
	if media == wire.MediaProtobuf {
		return &protoListWriter{out: out}
	}
	return &jsonListWriter{out: out}
}

// jsonListWriter writes {"kind":"ServiceList","apiVersion":"v1",
// "metadata":{"resourceVersion":…},"items":[…]}, metadata and items in the
// order the API server sent them.
type jsonListWriter struct {
	out      *bufio.Writer
	metaDone bool
	// itemsOpen: 0 before the items array, 1 in it, 2 after it; itemsN
	// counts the items written.
	itemsOpen, itemsN int
}

func (w *jsonListWriter) begin(uint64) error {
	_, err := w.out.WriteString(`{"kind":"ServiceList","apiVersion":"v1"`)
	return err
}

func (w *jsonListWriter) meta(m service.ListMeta) error {
	if w.metaDone {
		return errors.New("list metadata given twice")
	}
	w.metaDone = true
	if err := w.closeItems(); err != nil {
		return err
	}
	b, err := json.Marshal(metav1.ListMeta{ResourceVersion: m.ResourceVersion})
	if err != nil {
		return err
	}
	_, _ = w.out.WriteString(`,"metadata":`)
	_, err = w.out.Write(b)
	return err
}

func (w *jsonListWriter) item(s *service.Service) error {
	switch {
	case w.itemsOpen == 0:
		w.itemsOpen = 1
		_, _ = w.out.WriteString(`,"items":[`)
	case w.itemsOpen == 2:
		return errors.New("list items given in two places")
	case w.itemsN > 0:
		_ = w.out.WriteByte(',')
	}
	w.itemsN++
	return s.WriteWithoutClass(w.out)
}

// closeItems ends the items array if one is open.
func (w *jsonListWriter) closeItems() error {
	if w.itemsOpen != 1 {
		return nil
	}
	w.itemsOpen = 2
	return w.out.WriteByte(']')
}

func (w *jsonListWriter) end() error {
	if err := w.closeItems(); err != nil {
		return err
	}
	if w.itemsOpen == 0 {
		_, _ = w.out.WriteString(`,"items":[]`)
	}
	if !w.metaDone {
		_, _ = w.out.WriteString(`,"metadata":{}`)
	}
	return w.out.WriteByte('}')
}

// protoListBuffer is how much of a protobuf list's answer the gate holds
// before it streams the rest (see protoListWriter).
var protoListBuffer = 1 << 20

// pbListPadding is the ServiceList field that pads a streamed answer to the
// length announced before the Services were read. ServiceList has fields 1
// and 2; a decoder skips a field it does not know.
const pbListPadding protowire.Number = 15

// protoListWriter writes "k8s\x00" Unknown{TypeMeta{v1, ServiceList}, raw:
// ServiceList{1: ListMeta{resourceVersion}, 2: items}}.
//
// The list message's length comes before it, and is known only once every
// Service has been read. Up to protoListBuffer the gate holds the message and
// sends it with its exact length (a CCM usually sees a small part of a
// cluster's Services). Beyond, it announces the length of the API server's
// list, streams the Services as it reads them, and fills the difference with
// padding (field 15, zeros) that every protobuf decoder skips: the gate never
// holds more than one Service plus the buffer, however many Services the
// cluster has. What it writes is never longer than what it read: a list's
// metadata shrinks to its resourceVersion, a Service to itself without its
// class.
type protoListWriter struct {
	out *bufio.Writer
	// length is the API server's list message length; written what has been
	// streamed of it.
	length, written uint64
	streaming       bool
	buf, field      []byte
}

func (w *protoListWriter) begin(length uint64) error {
	w.length = length
	w.buf = make([]byte, 0, min(length, uint64(protoListBuffer)))
	_, _ = w.out.Write(wire.ProtoMagic)
	_, err := w.out.Write(wire.AppendProtoTypeMeta(nil, "ServiceList"))
	return err
}

func (w *protoListWriter) meta(m service.ListMeta) error {
	lm := metav1.ListMeta{ResourceVersion: m.ResourceVersion}
	b, err := lm.Marshal()
	if err != nil {
		return err
	}
	return w.emit(protowire.AppendBytes(protowire.AppendTag(w.field[:0], service.PbListMeta, protowire.BytesType), b))
}

func (w *protoListWriter) item(s *service.Service) error {
	f := protowire.AppendTag(w.field[:0], service.PbListItems, protowire.BytesType)
	f = protowire.AppendVarint(f, uint64(s.WithoutClassLen()))
	w.field = s.AppendWithoutClass(f)
	return w.emit(w.field)
}

// emit adds one field of the list message.
func (w *protoListWriter) emit(b []byte) error {
	if w.streaming {
		if w.written += uint64(len(b)); w.written > w.length {
			return errors.New("the list grew past the length announced")
		}
		_, err := w.out.Write(b)
		return err
	}
	w.buf = append(w.buf, b...)
	if len(w.buf) <= protoListBuffer {
		return nil
	}
	w.streaming = true
	_, _ = w.out.Write(protowire.AppendVarint(protowire.AppendTag(nil, wire.PbUnknownRaw, protowire.BytesType), w.length))
	b, w.buf = w.buf, nil
	w.written = uint64(len(b))
	if w.written > w.length {
		return errors.New("the list grew past the length announced")
	}
	_, err := w.out.Write(b)
	return err
}

func (w *protoListWriter) end() error {
	if !w.streaming {
		_, _ = w.out.Write(protowire.AppendVarint(protowire.AppendTag(nil, wire.PbUnknownRaw, protowire.BytesType), uint64(len(w.buf))))
		_, err := w.out.Write(w.buf)
		return err
	}
	return writeProtoPadding(w.out, w.length-w.written)
}

// writeProtoPadding writes fields pbListPadding of exactly n bytes in all
// (n is never 1: every field the gate leaves out is two bytes or more).
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

// eventWriter writes a watch's events.
type eventWriter interface {
	write(s send) error
}

func newEventWriter(media wire.Media, out *bufio.Writer) eventWriter {
	if media == wire.MediaProtobuf {
		return &protoEventWriter{out: out}
	}
	return &jsonEventWriter{out: out}
}

// jsonEventWriter writes one {"type":…,"object":…} line per event.
type jsonEventWriter struct{ out *bufio.Writer }

func (w *jsonEventWriter) write(s send) error {
	if s.kind == sendNothing {
		return nil
	}
	_, _ = w.out.WriteString(`{"type":"` + s.typ + `","object":`)
	var err error
	if s.kind == sendService {
		err = s.svc.WriteWithoutClass(w.out)
	} else {
		obj, _ := constructed(s)
		var b []byte
		if b, err = json.Marshal(obj); err == nil {
			_, err = w.out.Write(b)
		}
	}
	if err != nil {
		return err
	}
	_, err = w.out.WriteString("}\n")
	return err
}

// protoEventWriter writes frames of a 4-byte big-endian length and a
// WatchEvent{1: type, 2: RawExtension{1: "k8s\x00" Unknown{TypeMeta, raw}}}.
type protoEventWriter struct {
	out             *bufio.Writer
	object, message []byte
}

func (w *protoEventWriter) write(s send) error {
	if s.kind == sendNothing {
		return nil
	}
	obj := append(w.object[:0], wire.ProtoMagic...)
	switch s.kind {
	case sendService:
		obj = wire.AppendProtoTypeMeta(obj, "Service")
		obj = protowire.AppendVarint(protowire.AppendTag(obj, wire.PbUnknownRaw, protowire.BytesType), uint64(s.svc.WithoutClassLen()))
		obj = s.svc.AppendWithoutClass(obj)
	default:
		o, kind := constructed(s)
		raw, err := o.Marshal()
		if err != nil {
			return err
		}
		obj = wire.AppendProtoTypeMeta(obj, kind)
		obj = protowire.AppendBytes(protowire.AppendTag(obj, wire.PbUnknownRaw, protowire.BytesType), raw)
	}
	w.object = obj
	w.message = wire.AppendProtoWatchEvent(w.message[:0], s.typ, obj)
	var l [4]byte
	binary.BigEndian.PutUint32(l[:], uint32(len(w.message)))
	_, _ = w.out.Write(l[:])
	_, err := w.out.Write(w.message)
	return err
}

// constructedObject is a tombstone, bookmark or Status: apimachinery types,
// encoded by their generated code.
type constructedObject interface {
	// Marshal is the protobuf encoding (the envelope names the kind).
	Marshal() ([]byte, error)
}

// constructed builds the object of a tombstone, a bookmark or a Status from
// the fields the decision gave it, and nothing else.
func constructed(s send) (obj constructedObject, kind string) {
	switch s.kind {
	case sendTombstone:
		return &corev1.Service{
			TypeMeta:   metav1.TypeMeta{Kind: "Service", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Namespace: s.meta.Namespace, Name: s.meta.Name, UID: types.UID(s.meta.UID), ResourceVersion: s.meta.ResourceVersion},
		}, "Service"
	case sendBookmark:
		b := &corev1.Service{TypeMeta: metav1.TypeMeta{Kind: "Service", APIVersion: "v1"}, ObjectMeta: metav1.ObjectMeta{ResourceVersion: s.meta.ResourceVersion}}
		if s.meta.InitialEventsEnd {
			b.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
		}
		return b, "Service"
	default:
		st := metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status: s.status.Status, Code: s.status.Code, Reason: s.status.Reason, Message: s.status.Message}
		return &st, "Status"
	}
}

// SingleAnswer is the answer to a get or a write of one Service in the view:
// the Service without its class.
func SingleAnswer(media wire.Media, s *service.Service) []byte {
	if media == wire.MediaProtobuf {
		b := wire.AppendProtoTypeMeta(append([]byte(nil), wire.ProtoMagic...), "Service")
		b = protowire.AppendVarint(protowire.AppendTag(b, wire.PbUnknownRaw, protowire.BytesType), uint64(s.WithoutClassLen()))
		return s.AppendWithoutClass(b)
	}
	return s.AppendWithoutClass(make([]byte, 0, s.WithoutClassLen()))
}

// TombstoneAnswer is the answer to a write whose Service left the view with
// it: the Service's namespace, name, uid and new resourceVersion.
func TombstoneAnswer(media wire.Media, f service.Facts) ([]byte, error) {
	obj, kind := constructed(send{kind: sendTombstone, meta: service.Facts{Namespace: f.Namespace, Name: f.Name, UID: f.UID, ResourceVersion: f.ResourceVersion}})
	if media != wire.MediaProtobuf {
		return json.Marshal(obj)
	}
	raw, err := obj.Marshal()
	if err != nil {
		return nil, err
	}
	b := wire.AppendProtoTypeMeta(append([]byte(nil), wire.ProtoMagic...), kind)
	return protowire.AppendBytes(protowire.AppendTag(b, wire.PbUnknownRaw, protowire.BytesType), raw), nil
}
