package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/nodeview"
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

// nodeAnswer travels with a GET of a Node (or its status) to ModifyResponse.
type nodeAnswer struct {
	rt route
	// in holds the client's credentials (for the gate's reads of the Node).
	in http.Header
	// media is the encoding the gate reads (nodeview.CheckAnswer).
	media wire.Media
	// held is set for a held answer (nodeview.CheckHeld).
	held *heldRead
}

type nodeAnswerKey struct{}

// maxNodeAnswer bounds a single-Node answer the gate reads or holds (the API
// server's own limit for an object is far lower).
const maxNodeAnswer = 8 << 20

// forwardChecked forwards a GET of a Node or its status (nodeview.CheckAnswer) with the
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
	l, err := nodeview.Labels(a.media, body.body)
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
