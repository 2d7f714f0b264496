package proxy

import (
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

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
}

func (f serviceFacts) key() string { return f.namespace + "/" + f.name }

// Field numbers of the Service's protobuf message (k8s.io/api/core/v1).
const (
	pbServiceMetadata        protowire.Number = 1
	pbServiceSpec            protowire.Number = 2
	pbMetaName               protowire.Number = 1
	pbMetaNamespace          protowire.Number = 3
	pbMetaUID                protowire.Number = 5
	pbMetaResourceVersion    protowire.Number = 6
	pbMetaAnnotations        protowire.Number = 12
	pbMetaFinalizers         protowire.Number = 14
	pbSpecType               protowire.Number = 4
	pbSpecLoadBalancerClass  protowire.Number = 21
	pbListMeta               protowire.Number = 1
	pbListItems              protowire.Number = 2
	pbListRemainingItemCount protowire.Number = 4
	pbWatchEventType         protowire.Number = 1
	pbWatchEventObject       protowire.Number = 2
	pbRawExtensionRaw        protowire.Number = 1
	pbUnknownRaw             protowire.Number = 2
)

// protoServiceFacts reads a Service message.
func protoServiceFacts(msg []byte) (serviceFacts, error) {
	sc := protoServiceScan{meta: true}
	err := sc.scan(msg)
	return sc.facts, err
}

// protoServiceWithoutClass returns the Service message without
// spec.loadBalancerClass (msg itself if it has none).
func protoServiceWithoutClass(msg []byte) ([]byte, error) {
	var sc protoServiceScan
	if err := sc.scan(msg); err != nil || len(sc.specs) == 0 {
		return msg, err
	}
	return sc.appendStripped(make([]byte, 0, sc.strippedLen(msg)), msg), nil
}

// protoServiceForWrite returns a Service message as the CCM sent it in a PUT,
// with spec.loadBalancerClass set to class (when the stored Service has one)
// and metadata.resourceVersion set to rv when the CCM sent none.
func protoServiceForWrite(msg []byte, class string, hasClass bool, rv string) ([]byte, error) {
	sent, err := protoServiceFacts(msg)
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
func checkSentClass(sent serviceFacts, class string, hasClass bool) error {
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

// jsonServiceFacts reads a Service object.
func jsonServiceFacts(b []byte) (serviceFacts, error) {
	sc := jsonServiceScan{meta: true}
	err := sc.scan(b)
	return sc.facts, err
}

// jsonServiceWithoutClass returns the Service object b without
// spec.loadBalancerClass (b itself if it has none).
func jsonServiceWithoutClass(b []byte) ([]byte, error) {
	var sc jsonServiceScan
	if err := sc.scan(b); err != nil {
		return nil, err
	}
	return sc.withoutClass(b), nil
}

// jsonServiceForWrite is protoServiceForWrite for a JSON body. A body with a
// repeated metadata, spec, resourceVersion or loadBalancerClass is refused:
// which one counts would be up to the decoder.
func jsonServiceForWrite(b []byte, class string, hasClass bool, rv string) ([]byte, error) {
	sent, err := jsonServiceFacts(b)
	if err != nil {
		return nil, err
	}
	if err := checkSentClass(sent, class, hasClass); err != nil {
		return nil, err
	}
	var edits []jsonEdit
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
	insert := func(start int, key string, value []byte, null *jsonMember) jsonEdit {
		if null != nil {
			return jsonEdit{start: null.valueStart, end: null.valueEnd, with: value}
		}
		member := append(append([]byte(`"`+key+`":`), value...), ',')
		if j := skipJSONSpace(b, start+1); j < len(b) && b[j] == '}' {
			member = member[:len(member)-1]
		}
		return jsonEdit{start: start + 1, end: start + 1, with: member}
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
	return applyJSONEdits(b, edits), nil
}

// jsonListMetaWithoutCount drops remainingItemCount from a list's metadata:
// it counts the Services the view hides.
func jsonListMetaWithoutCount(v []byte) ([]byte, error) {
	if len(v) == 0 || v[0] != '{' {
		return v, nil
	}
	out, changed, err := jsonWithoutMembers(v, 0, func(k string) bool { return k == "remainingItemCount" })
	if err != nil || !changed {
		return v, err
	}
	return out, nil
}
