package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// A GET of a Node (or its status) that prefers a form the gate does not
// decode — a Table (kubectl get node), PartialObjectMetadata (client-go's
// metadata client), YAML, CBOR — is forwarded as the client asked for it, so
// that the API server answers in the form it would without the gate, and its
// answer is held until the gate knows that it shows the Node in the view:
//
//  1. the gate reads the Node (a quorum read): outside the view or gone, it
//     answers 404 and forwards nothing;
//  2. it forwards the GET without any resourceVersion, so that the API server
//     answers from its current state (a quorum read) and never from its watch
//     cache with a version older than the read of step 1, and holds the
//     answer whole (at most maxNodeAnswer);
//  3. it reads the Node again: outside the view or gone, it answers 404 and
//     drops the answer; with the same uid and resourceVersion as in step 1,
//     it releases the answer.
//
// A resourceVersion is the Node's alone and grows with every change: the
// same one before and after the GET means that the Node did not change in
// between, so that the GET, answered in between, shows the Node as both reads
// saw it, in the view. When the Node changed (but is still in the view) the
// gate drops the answer and forwards the GET again, the read of step 3 being
// the next attempt's step 1; after maxHeldAttempts it answers 503 with
// Retry-After, which client-go retries, never an answer it could not check.
//
// A held read costs the forwarded GET and two reads of the Node's metadata,
// and one more of each per attempt after the first.

// maxHeldAttempts bounds how often the gate forwards a held read of a Node
// that changes on every attempt.
const maxHeldAttempts = 3

// errNodeChanged: the Node changed between the reads around a held answer;
// forwardHeld forwards the GET again. The error handler answers nothing.
var errNodeChanged = errors.New("node changed during the read")

// heldRead is the state of one attempt of a held read.
type heldRead struct {
	// before is the Node as read before the GET was forwarded (in the view).
	before nodeMeta
	// changed says that the Node changed during the attempt but is still in
	// the view; after is then the Node as read after the answer, the next
	// attempt's before.
	changed bool
	after   nodeMeta
}

// forwardHeld forwards a GET of a Node or its status whose answer the gate
// does not decode (nodeview.CheckHeld), and shows the answer only when the reads of
// the Node before and after it agree.
func (p *Proxy) forwardHeld(w http.ResponseWriter, r *http.Request, rt route) {
	before, ok := p.shown(w, r, rt, false)
	if !ok {
		return
	}
	if q := r.URL.Query(); q.Has("resourceVersion") {
		// resourceVersion=0 (any version) or =N (not older than N) may be
		// answered from the watch cache, with the Node as it was before the
		// read: without it the GET is a quorum read, which satisfies both.
		q.Del("resourceVersion")
		r.URL.RawQuery = q.Encode()
	}
	r.RequestURI = ""
	for attempt := 1; ; attempt++ {
		if r.GetBody != nil {
			// the body (a GET has none that means anything) is read again
			var err error
			if r.Body, err = r.GetBody(); err != nil {
				p.refuse(w, r, rt, badRequest(err))
				return
			}
		}
		h := &heldRead{before: before}
		a := &nodeAnswer{rt: rt, in: r.Header, held: h}
		p.log.V(5).Info("forwarding", "method", r.Method, "path", r.URL.Path, "query", r.URL.RawQuery, "decision", "held", "attempt", attempt)
		p.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), nodeAnswerKey{}, a)))
		if !h.changed {
			return // answered: released, hidden or failed
		}
		if r.Context().Err() != nil {
			return // the client went away
		}
		if attempt == maxHeldAttempts {
			p.metrics.requests.WithLabelValues(rt.kind.String(), decisionError).Inc()
			p.log.Info("node changed during every attempt of a read; answered 503", "node", rt.name, "subresource", rt.subresource, "attempts", attempt)
			w.Header().Set("Retry-After", "1")
			writeStatus(w, nodeChangedDuringRead(rt.name, attempt))
			return
		}
		p.log.V(2).Info("node changed during a read; reading again", "node", rt.name, "subresource", rt.subresource,
			"resourceVersion", before.ResourceVersion, "now", h.after.ResourceVersion, "attempt", attempt)
		before = h.after
	}
}

// holdNodeAnswer holds the answer to a GET of a Node (nodeview.CheckHeld) and reads
// the Node again: the answer is released when the Node is unchanged since
// the read before the GET, replaced by the gate's 404 when it is no longer in
// the view, and dropped (errNodeChanged) when it changed otherwise.
func (p *Proxy) holdNodeAnswer(resp *http.Response, a *nodeAnswer) error {
	if done, err := p.nodeErrorAnswer(resp, a); done {
		return err
	}
	body, err := p.readNodeAnswer(resp)
	if errors.Is(err, errAnswerBudget) {
		return p.budgetRefused(resp, a, err)
	}
	if err != nil {
		return fmt.Errorf("node %s: %w", a.rt.name, err)
	}
	h := a.held
	start := time.Now()
	after, found, err := p.readNode(resp.Request.Context(), a.in, a.rt.name)
	p.metrics.checks.WithLabelValues(sourceAPI).Observe(since(start))
	if err != nil {
		body.release()
		return err
	}
	if !found || !p.inView(after) {
		body.release()
		p.hideNodeAnswer(resp, a)
		return nil
	}
	if after.UID != h.before.UID || after.ResourceVersion != h.before.ResourceVersion {
		body.release()
		h.changed, h.after = true, after
		return errNodeChanged
	}
	p.metrics.requests.WithLabelValues(a.rt.kind.String(), decisionForwarded).Inc()
	setAnswerBody(resp, body.body, body)
	return nil
}
