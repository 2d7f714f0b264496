package nodeview

import (
	"encoding/json"
	"fmt"
	"net/http"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/wire"
)

// ReadCheck is how the view checks a read of one Node.
type ReadCheck int

const (
	// CheckBefore: a read of the Node before the request is forwarded.
	CheckBefore ReadCheck = iota
	// CheckAnswer: the Node in the answer (JSON or protobuf).
	CheckAnswer
	// CheckHeld: reads of the Node before and after the answer, which is
	// held until they agree.
	CheckHeld
)

// ReadCheckOf says how a request for one Node (its method, the subresource
// of its path and its Accept headers) is checked when it is a read, and for
// CheckAnswer in which encoding the gate asks for the answer.
func ReadCheckOf(method, subresource string, accept []string) (ReadCheck, wire.Media) {
	if method != http.MethodGet || (subresource != "" && subresource != "status") {
		return CheckBefore, wire.MediaNone
	}
	if m, ok := plainPreferred(accept); ok {
		return CheckAnswer, m
	}
	return CheckHeld, wire.MediaNone
}

// pbNodeMetadata is the field number of Node's metadata.
const pbNodeMetadata protowire.Number = 1

// Labels reads the labels of a Node: JSON, or protobuf in its envelope.
func Labels(media wire.Media, body []byte) (map[string]string, error) {
	if media == wire.MediaProtobuf {
		o, err := wire.ReadProtoObject(body)
		if err != nil {
			return nil, err
		}
		if o.Kind != "Node" {
			return nil, fmt.Errorf("a %q, not a Node", o.Kind)
		}
		l := map[string]string{}
		err = wire.ProtoFields(o.Raw, func(f wire.ProtoField) error {
			if f.Num != pbNodeMetadata || f.Type != protowire.BytesType {
				return nil
			}
			return wire.ProtoFields(f.Value, func(m wire.ProtoField) error {
				if m.Num != wire.PbMetaLabels || m.Type != protowire.BytesType {
					return nil
				}
				key, value, err := wire.ProtoMapEntry(m.Value)
				l[string(key)] = string(value)
				return err
			})
		})
		return l, err
	}
	var n struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(body, &n); err != nil {
		return nil, err
	}
	if n.Kind != "Node" {
		return nil, fmt.Errorf("a %q, not a Node", n.Kind)
	}
	return n.Metadata.Labels, nil
}
