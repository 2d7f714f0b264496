package proxy

import (
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// The write path: a PUT carries a whole Service as the CCM saw it, without
// its class; the gate puts the stored class back before it forwards it.

// serviceForWrite returns a PUT body (JSON, or protobuf in its envelope)
// with the stored Service's class put back, and its resourceVersion when the
// body has none.
func serviceForWrite(media mediaKind, body []byte, stored serviceFacts) ([]byte, error) {
	if media != mediaProtobuf {
		return jsonServiceForWrite(body, stored.class, stored.hasClass, stored.resourceVersion)
	}
	o, err := readProtoObject(body)
	if err != nil {
		return nil, err
	}
	raw, err := protoServiceForWrite(o.raw, stored.class, stored.hasClass, stored.resourceVersion)
	if err != nil {
		return nil, err
	}
	return rewrapProtoObject(body, raw)
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
	if hasClass && !sent.hasClass {
		// Without a spec the Service becomes a ClusterIP, and the API server
		// drops the class itself.
		if out, err = protoAppendToLast(out, pbServiceSpec, pbSpecLoadBalancerClass, class); err != nil {
			return nil, err
		}
	}
	if sent.resourceVersion == "" && rv != "" {
		if out, err = protoAppendToLast(out, pbServiceMetadata, pbMetaResourceVersion, rv); err != nil {
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
	if err := protoFields(msg, func(f protoField) error {
		if f.num == field && f.typ == protowire.BytesType {
			count++
		}
		return nil
	}); err != nil {
		return nil, err
	}
	seen := 0
	return protoEdit(msg, field, func(v []byte) ([]byte, bool, bool, error) {
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
func checkSentClass(sent *service, class string, hasClass bool) error {
	if sent.hasClass && (!hasClass || sent.class != class) {
		return &classError{sent: sent.class}
	}
	return nil
}

// classError is a write that would set or change spec.loadBalancerClass.
type classError struct{ sent string }

func (e *classError) Error() string {
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
	var edits []edit
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
	insert := func(start int, key string, value []byte, null *jsonMember) edit {
		if null != nil {
			return edit{start: null.valueStart, end: null.valueEnd, with: value}
		}
		member := append(append([]byte(`"`+key+`":`), value...), ',')
		if j := skipJSONSpace(b, start+1); j < len(b) && b[j] == '}' {
			member = member[:len(member)-1]
		}
		return edit{start: start + 1, end: start + 1, with: member}
	}
	quotedClass, _ := json.Marshal(class)
	quotedRV, _ := json.Marshal(rv)
	i := skipJSONSpace(b, 0)
	_, err = jsonObjectMembers(b, i, func(m jsonMember) error {
		switch m.key {
		case "metadata":
			if err := once("metadata"); err != nil || b[m.valueStart] != '{' {
				return err
			}
			var rvMember *jsonMember
			rvSet := false
			if _, err := jsonObjectMembers(b, m.valueStart, func(mm jsonMember) error {
				if mm.key != "resourceVersion" {
					return nil
				}
				if err := once("metadata.resourceVersion"); err != nil {
					return err
				}
				if v := string(b[mm.valueStart:mm.valueEnd]); v == "null" || v == `""` {
					rvMember = &mm
				} else {
					rvSet = true
				}
				return nil
			}); err != nil {
				return err
			}
			if !rvSet && rv != "" {
				edits = append(edits, insert(m.valueStart, "resourceVersion", quotedRV, rvMember))
			}
		case "spec":
			if err := once("spec"); err != nil || b[m.valueStart] != '{' {
				return err
			}
			var classMember *jsonMember
			if _, err := jsonObjectMembers(b, m.valueStart, func(sm jsonMember) error {
				if sm.key != "loadBalancerClass" {
					return nil
				}
				if err := once("spec.loadBalancerClass"); err != nil {
					return err
				}
				if string(b[sm.valueStart:sm.valueEnd]) == "null" {
					classMember = &sm
				}
				return nil
			}); err != nil {
				return err
			}
			if hasClass && !sent.hasClass {
				edits = append(edits, insert(m.valueStart, "loadBalancerClass", quotedClass, classMember))
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
	return appendEdited(make([]byte, 0, editedLen(b, edits)), b, edits), nil
}
