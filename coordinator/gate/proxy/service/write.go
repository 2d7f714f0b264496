package service

import (
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/wire"
)

// The write path: a PUT carries a whole Service as the CCM saw it, without
// its class; the gate puts the stored class back before it forwards it.

// ForWrite returns a PUT body (JSON, or protobuf in its envelope)
// with the stored Service's class put back, and its resourceVersion when the
// body has none.
func ForWrite(media wire.Media, body []byte, stored Facts) ([]byte, error) {
	if media != wire.MediaProtobuf {
		return jsonServiceForWrite(body, stored.Class, stored.HasClass, stored.ResourceVersion)
	}
	o, err := wire.ReadProtoObject(body)
	if err != nil {
		return nil, err
	}
	raw, err := protoServiceForWrite(o.Raw, stored.Class, stored.HasClass, stored.ResourceVersion)
	if err != nil {
		return nil, err
	}
	return wire.RewrapProtoObject(body, raw)
}

// protoServiceForWrite returns a Service message as the CCM sent it in a PUT,
// with spec.loadBalancerClass set to class (when the stored Service has one)
// and metadata.resourceVersion set to rv when the CCM sent none.
func protoServiceForWrite(msg []byte, class string, hasClass bool, rv string) ([]byte, error) {
	sc := protoServiceScanner{meta: true}
	sent, err := sc.scan(msg)
	if err != nil {
		return nil, err
	}
	if err := checkSentClass(sent, class, hasClass); err != nil {
		return nil, err
	}
	out := msg
	if hasClass && !sent.HasClass {
		// Without a spec the Service becomes a ClusterIP, and the API server
		// drops the class itself.
		if out, err = protoAppendToLast(out, pbServiceSpec, pbSpecLoadBalancerClass, class); err != nil {
			return nil, err
		}
	}
	if sent.ResourceVersion == "" && rv != "" {
		if out, err = protoAppendToLast(out, pbServiceMetadata, wire.PbMetaResourceVersion, rv); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// protoAppendToLast appends the string field num=value to the last embedded
// message field of msg: repeated embedded messages merge in order, and the
// last occurrence of a scalar wins, so this one counts.
func protoAppendToLast(msg []byte, field, num protowire.Number, value string) ([]byte, error) {
	count := 0
	if err := wire.ProtoFields(msg, func(f wire.ProtoField) error {
		if f.Num == field && f.Type == protowire.BytesType {
			count++
		}
		return nil
	}); err != nil {
		return nil, err
	}
	seen := 0
	return wire.ProtoEdit(msg, field, func(v []byte) ([]byte, bool, bool, error) {
		if seen++; seen < count {
			return v, false, false, nil
		}
		out := protowire.AppendTag(append(make([]byte, 0, len(v)+len(value)+8), v...), num, protowire.BytesType)
		return protowire.AppendString(out, value), false, true, nil
	})
}

// checkSentClass refuses a Service body that sets a class other than the
// stored one: the view never shows a class, so a CCM that sends one is not
// writing what it was shown.
func checkSentClass(sent *Service, class string, hasClass bool) error {
	if sent.HasClass && (!hasClass || sent.Class != class) {
		return &ClassError{sent: sent.Class}
	}
	return nil
}

// ClassError is a write that would set or change spec.loadBalancerClass.
type ClassError struct{ sent string }

func (e *ClassError) Error() string {
	return fmt.Sprintf("spec.loadBalancerClass %q: the view hides the class, and a native CCM may not set or change it", e.sent)
}

// jsonServiceForWrite is protoServiceForWrite for a JSON body. A body with a
// repeated metadata, spec, resourceVersion or loadBalancerClass is refused:
// which one counts would be up to the decoder.
func jsonServiceForWrite(b []byte, class string, hasClass bool, rv string) ([]byte, error) {
	sc := jsonServiceScanner{meta: true}
	sent, err := sc.scan(b)
	if err != nil {
		return nil, err
	}
	if err := checkSentClass(sent, class, hasClass); err != nil {
		return nil, err
	}
	var edits []wire.Edit
	seen := map[string]bool{}
	once := func(name string) error {
		if seen[name] {
			return fmt.Errorf("%s given twice", name)
		}
		seen[name] = true
		return nil
	}
	// insert adds `"key":value` to the object at b[start] ('{'), or sets a
	// null member's value.
	insert := func(start int, key string, value []byte, null *wire.JSONMember) wire.Edit {
		if null != nil {
			return wire.Edit{Start: null.ValueStart, End: null.ValueEnd, With: value}
		}
		member := append(append([]byte(`"`+key+`":`), value...), ',')
		if j := wire.SkipJSONSpace(b, start+1); j < len(b) && b[j] == '}' {
			member = member[:len(member)-1]
		}
		return wire.Edit{Start: start + 1, End: start + 1, With: member}
	}
	quotedClass, _ := json.Marshal(class)
	quotedRV, _ := json.Marshal(rv)
	i := wire.SkipJSONSpace(b, 0)
	_, err = wire.JSONObjectMembers(b, i, func(m wire.JSONMember) error {
		switch m.Key {
		case "metadata":
			if err := once("metadata"); err != nil || b[m.ValueStart] != '{' {
				return err
			}
			var rvMember *wire.JSONMember
			rvSet := false
			if _, err := wire.JSONObjectMembers(b, m.ValueStart, func(mm wire.JSONMember) error {
				if mm.Key != "resourceVersion" {
					return nil
				}
				if err := once("metadata.resourceVersion"); err != nil {
					return err
				}
				if v := string(b[mm.ValueStart:mm.ValueEnd]); v == "null" || v == `""` {
					rvMember = &mm
				} else {
					rvSet = true
				}
				return nil
			}); err != nil {
				return err
			}
			if !rvSet && rv != "" {
				edits = append(edits, insert(m.ValueStart, "resourceVersion", quotedRV, rvMember))
			}
		case "spec":
			if err := once("spec"); err != nil || b[m.ValueStart] != '{' {
				return err
			}
			var classMember *wire.JSONMember
			if _, err := wire.JSONObjectMembers(b, m.ValueStart, func(sm wire.JSONMember) error {
				if sm.Key != "loadBalancerClass" {
					return nil
				}
				if err := once("spec.loadBalancerClass"); err != nil {
					return err
				}
				if string(b[sm.ValueStart:sm.ValueEnd]) == "null" {
					classMember = &sm
				}
				return nil
			}); err != nil {
				return err
			}
			if hasClass && !sent.HasClass {
				edits = append(edits, insert(m.ValueStart, "loadBalancerClass", quotedClass, classMember))
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !seen["metadata"] && rv != "" {
		return nil, fmt.Errorf("no metadata")
	}
	return wire.AppendEdited(make([]byte, 0, wire.EditedLen(b, edits)), b, edits), nil
}
