package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/wire"
)

// A GET of a Node (or its status) is shown only when what it shows is the
// Node in the view, whatever the node cache holds (it is a watch of its own
// and may be behind a client's: a client that has just seen a Node leave the
// view, on its own watch through the gate, may GET it before the cache has
// heard of the change), and with no cache at all. A check before the GET
// alone could not promise that: a read of the Node is one request, the GET
// another, with a relabel possible in between. So:
//
//   - an answer the gate decodes (a plain Node in JSON or protobuf, which the
//     client prefers to any other form) is checked itself (checkNodeAnswer):
//     the Node in it is in the view or the gate answers 404;
//   - an answer in any other form (Table, PartialObjectMetadata, YAML, CBOR)
//     is held (nodehold.go) until a read of the Node after it shows the Node
//     in the view and unchanged since the read before it.
//
// Other reads of a Node (HEAD, which the API server refuses with 405, and the
// proxy subresource, the kubelet's answer) are checked with a read of the
// Node before they are forwarded only.

// nodeReadCheck is how the view checks a read of one Node.
type nodeReadCheck int

const (
	// checkBefore: a read of the Node before the request is forwarded.
	checkBefore nodeReadCheck = iota
	// checkAnswer: the Node in the answer (JSON or protobuf).
	checkAnswer
	// checkHeld: reads of the Node before and after the answer, which is
	// held until they agree.
	checkHeld
)

// nodeAnswer travels with a GET of a Node (or its status) to ModifyResponse.
type nodeAnswer struct {
	rt route
	// in holds the client's credentials (for the gate's reads of the Node).
	in http.Header
	// media is the encoding the gate reads (checkAnswer).
	media wire.Media
	// held is set for a held answer (checkHeld).
	held *heldRead
}

type nodeAnswerKey struct{}

// maxNodeAnswer bounds a single-Node answer the gate reads or holds (the API
// server's own limit for an object is far lower).
const maxNodeAnswer = 8 << 20

// nodeReadOf says how a request for one Node is checked when it is a read,
// and for checkAnswer in which encoding the gate asks for the answer.
func nodeReadOf(r *http.Request, rt route) (nodeReadCheck, wire.Media) {
	if r.Method != http.MethodGet || (rt.subresource != "" && rt.subresource != "status") {
		return checkBefore, wire.MediaNone
	}
	if m, ok := plainPreferred(r.Header.Values("Accept")); ok {
		return checkAnswer, m
	}
	return checkHeld, wire.MediaNone
}

// forwardChecked forwards a GET of a Node or its status (checkAnswer) with the
// check of its answer.
func (p *Proxy) forwardChecked(w http.ResponseWriter, r *http.Request, rt route, media wire.Media) {
	prepareAnswerRequest(r, media)
	a := &nodeAnswer{media: media, rt: rt, in: r.Header}
	p.log.V(5).Info("forwarding", "method", r.Method, "path", r.URL.Path, "query", r.URL.RawQuery, "decision", "checked")
	p.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), nodeAnswerKey{}, a)))
}

// checkNodeAnswer answers 404 in place of a Node outside the view, and in
// place of the API server's own 404: the gate's, the same for both.
func (p *Proxy) checkNodeAnswer(resp *http.Response, a *nodeAnswer) error {
	if a.held != nil {
		return p.holdNodeAnswer(resp, a)
	}
	if done, err := p.nodeErrorAnswer(resp, a); done {
		return err
	}
	if got := wire.MediaOf(resp.Header.Get("Content-Type")); got != a.media {
		return fmt.Errorf("%w: node %s: Content-Type %q where %q was asked for", errUndecodedAnswer, a.rt.name, resp.Header.Get("Content-Type"), a.media.ContentType())
	}
	body, err := p.readNodeAnswer(resp)
	if errors.Is(err, errAnswerBudget) {
		return p.budgetRefused(resp, a, err)
	}
	if err != nil {
		return fmt.Errorf("node %s: %w", a.rt.name, err)
	}
	l, err := nodeLabels(a.media, body.body)
	if err != nil {
		body.release()
		return fmt.Errorf("%w: node %s: %w", errUndecodedAnswer, a.rt.name, err)
	}
	if !p.selector.Matches(labels.Set(l)) {
		body.release()
		p.hideNodeAnswer(resp, a)
		return nil
	}
	p.metrics.requests.WithLabelValues(a.rt.kind.String(), decisionForwarded).Inc()
	setAnswerBody(resp, body.body, body)
	return nil
}

// nodeErrorAnswer handles an answer that is not a Node (not 200): the API
// server's 404 becomes the gate's, its error answers are relayed as they
// came, and anything else fails closed (errUndecodedAnswer). done is false
// for a 200.
func (p *Proxy) nodeErrorAnswer(resp *http.Response, a *nodeAnswer) (done bool, err error) {
	switch {
	case resp.StatusCode == http.StatusOK:
		return false, nil
	case resp.StatusCode == http.StatusNotFound:
		// The gate's own 404, as for a Node outside the view: the two must
		// not be told apart. The API server's differs (in the client's
		// encoding, protobuf too, with its own headers and a newline).
		_ = resp.Body.Close()
		p.metrics.requests.WithLabelValues(a.rt.kind.String(), decisionHidden).Inc()
		hideAnswer(resp, notFound(nodesResource, a.rt.name))
		return true, nil
	case resp.StatusCode >= http.StatusBadRequest:
		// The API server's own error answer (401, 403, 406, 429, ...), as
		// for the gate's own read of a Node: it shows nothing of the Node.
		p.metrics.requests.WithLabelValues(a.rt.kind.String(), decisionForwarded).Inc()
		return true, nil
	default:
		// Neither a Node the gate checks nor an error: not relayed raw.
		return true, fmt.Errorf("%w: node %s: %s to a GET", errUndecodedAnswer, a.rt.name, resp.Status)
	}
}

// budgetRefused answers a GET of a Node whose answer the gate cannot hold
// within the answer budget: 429 (errAnswerBudget) when a read of the Node
// shows it in the view, and the gate's 404 otherwise, as the answer would
// have been. A 429 for an answer showing the Node outside the view would
// tell its client that the Node still exists (a Node that is gone is the API
// server's 404, which the gate does not read), and something of its size.
func (p *Proxy) budgetRefused(resp *http.Response, a *nodeAnswer, refused error) error {
	start := time.Now()
	m, found, err := p.readNode(resp.Request.Context(), a.in, a.rt.name)
	p.metrics.checks.WithLabelValues(sourceAPI).Observe(since(start))
	if err != nil {
		return err
	}
	if !found || !p.inView(m) {
		p.hideNodeAnswer(resp, a)
		return nil
	}
	return fmt.Errorf("node %s: %w", a.rt.name, refused)
}

// hideNodeAnswer replaces an answer that shows a Node outside the view with
// the gate's 404.
func (p *Proxy) hideNodeAnswer(resp *http.Response, a *nodeAnswer) {
	_ = resp.Body.Close()
	p.metrics.requests.WithLabelValues(a.rt.kind.String(), decisionHidden).Inc()
	p.log.V(2).Info("node outside the view", "node", a.rt.name, "subresource", a.rt.subresource)
	hideAnswer(resp, notFound(nodesResource, a.rt.name))
}

// pbNodeMetadata is the field number of Node's metadata.
const pbNodeMetadata protowire.Number = 1

// nodeLabels reads the labels of a Node: JSON, or protobuf in its envelope.
func nodeLabels(media wire.Media, body []byte) (map[string]string, error) {
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
				// A map entry: 1: key, 2: value.
				var key, value []byte
				err := wire.ProtoFields(m.Value, func(e wire.ProtoField) error {
					switch {
					case e.Type != protowire.BytesType:
					case e.Num == 1:
						key = e.Value
					case e.Num == 2:
						value = e.Value
					}
					return nil
				})
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
