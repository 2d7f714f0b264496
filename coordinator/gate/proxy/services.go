package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/service"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/serviceview"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/wire"
)

// serviceMode is what the gate does with the API server's answer.
type serviceMode int

const (
	// serviceList filters a ServiceList.
	serviceList serviceMode = iota + 1
	// serviceWatch filters a watch of Services.
	serviceWatch
	// serviceGet answers 404 for a Service outside the view.
	serviceGet
	// serviceWritten strips the class from the Service a write returns.
	serviceWritten
)

// serviceAnswer travels with a forwarded Service request to ModifyResponse.
type serviceAnswer struct {
	mode  serviceMode
	media wire.Media
	rt    route
	watch *serviceview.WatchState
}

type serviceAnswerKey struct{}

// services serves every request about Services.
func (p *Proxy) services(w http.ResponseWriter, r *http.Request, rt route) {
	switch rt.kind {
	case routeServices:
		switch r.Method {
		case http.MethodGet:
			p.serviceRead(w, r, rt)
		case http.MethodPost:
			p.refuse(w, r, rt, forbidden(servicesResource, "create", "", errors.New("a native CCM never creates Services")))
		case http.MethodDelete:
			p.refuse(w, r, rt, forbidden(servicesResource, "deletecollection", "", errors.New("a native CCM never deletes Services")))
		default:
			p.refuse(w, r, rt, methodNotAllowed(servicesResource, r.Method, r.URL.Path))
		}
	case routeWatchServices:
		if r.Method != http.MethodGet {
			p.refuse(w, r, rt, methodNotAllowed(servicesResource, r.Method, r.URL.Path))
			return
		}
		p.serviceRead(w, r, rt)
	case routeService:
		switch {
		case rt.subresource != "" && rt.subresource != "status":
			p.refuse(w, r, rt, forbidden(servicesResource, rt.subresource, rt.name, errors.New("the view serves a Service and its status, nothing else")))
		case r.Method == http.MethodGet:
			p.serviceRead(w, r, rt)
		case r.Method == http.MethodPatch || r.Method == http.MethodPut:
			p.serviceWrite(w, r, rt)
		case r.Method == http.MethodDelete && rt.subresource == "":
			p.refuse(w, r, rt, forbidden(servicesResource, "delete", rt.name, errors.New("a native CCM never deletes Services")))
		default:
			p.refuse(w, r, rt, methodNotAllowed(servicesResource, r.Method, r.URL.Path))
		}
	}
}

// serviceRead forwards a list, watch or get of Services and filters the answer.
func (p *Proxy) serviceRead(w http.ResponseWriter, r *http.Request, rt route) {
	media, ok := serviceview.NegotiateMedia(r.Header.Values("Accept"))
	if !ok {
		p.refuse(w, r, rt, notAcceptable(r.Header.Get("Accept")))
		return
	}
	q := r.URL.Query()
	for _, k := range []string{"watch", "resourceVersion", "sendInitialEvents"} {
		if len(q[k]) > 1 {
			p.refuse(w, r, rt, badRequest(fmt.Errorf("%s given %d times", k, len(q[k]))))
			return
		}
	}
	a := &serviceAnswer{media: media, rt: rt}
	switch {
	case rt.kind == routeService:
		a.mode = serviceGet
	case rt.kind == routeWatchServices || serviceview.QueryBool(q, "watch"):
		a.mode = serviceWatch
		a.watch = serviceview.NewWatchState(p.serviceView, p.history, q)
	default:
		a.mode = serviceList
		// One page: a continue token names the key the next page starts
		// after, and a page's size and count tell how many Services match,
		// Services outside the view included. A pager that sent a limit gets
		// the whole list and no token; a token (none comes from the view) is
		// answered as the API server answers an expired one.
		if _, ok := q["continue"]; ok {
			p.refuse(w, r, rt, expired("the view lists Services in one page and hands out no continue tokens"))
			return
		}
		q.Del("limit")
		r.URL.RawQuery = q.Encode()
	}
	prepareServiceRequest(r, a)
	if a.mode == serviceGet {
		// Counted once the answer shows whether the Service is in the view.
		p.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), serviceAnswerKey{}, a)))
		return
	}
	cw := newCoalescingWriter(w, flushWindow)
	defer cw.close()
	p.forward(cw, r.WithContext(context.WithValue(r.Context(), serviceAnswerKey{}, a)), rt, decisionFiltered)
}

// serviceWrite forwards a PATCH or PUT of a Service (or its status) in the
// view. A PUT carries the Service as the CCM saw it, without its class: the
// gate puts the stored class back (and makes the write conditional on the
// version it checked, when the CCM's is unconditional), so the write never
// clears it. A PATCH is a difference between two views and never mentions the
// class; it passes unchanged (the API server refuses to change the class of
// a LoadBalancer Service anyway).
func (p *Proxy) serviceWrite(w http.ResponseWriter, r *http.Request, rt route) {
	media, ok := serviceview.NegotiateMedia(r.Header.Values("Accept"))
	if !ok {
		p.refuse(w, r, rt, notAcceptable(r.Header.Get("Accept")))
		return
	}
	f, found, err := p.readService(r.Context(), r.Header, rt.namespace, rt.name)
	if err != nil {
		p.lookupFailed(w, r, rt, err)
		return
	}
	if !found || !p.serviceView.Shows(f) {
		p.hide(w, r, rt)
		return
	}
	if r.Method == http.MethodPut {
		if err := p.restoreClass(r, f); err != nil {
			var refused *refusal
			if errors.As(err, &refused) {
				p.refuse(w, r, rt, refused.status)
				return
			}
			p.refuse(w, r, rt, badRequest(err))
			return
		}
	}
	a := &serviceAnswer{mode: serviceWritten, media: media, rt: rt}
	prepareServiceRequest(r, a)
	p.forward(w, r.WithContext(context.WithValue(r.Context(), serviceAnswerKey{}, a)), rt, decisionForwarded)
}

// refusal is an error with the answer it deserves.
type refusal struct{ status metav1.Status }

func (e *refusal) Error() string { return e.status.Message }

// restoreClass rewrites a PUT body: the stored class back in, and the
// resourceVersion the gate checked when the CCM sent none.
func (p *Proxy) restoreClass(r *http.Request, stored service.Facts) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, service.MaxBody+1))
	if err != nil {
		return fmt.Errorf("read body: %w", err)
	}
	if len(body) > service.MaxBody {
		return errors.New("body too large")
	}
	media := wire.MediaOf(r.Header.Get("Content-Type"))
	if media == wire.MediaNone {
		return &refusal{status: unsupportedMediaType(r.Header.Get("Content-Type"))}
	}
	out, err := service.ForWrite(media, body, stored)
	var classErr *service.ClassError
	if errors.As(err, &classErr) {
		return &refusal{status: forbidden(servicesResource, "update", stored.Name, err)}
	}
	if err != nil {
		return err
	}
	r.Body = io.NopCloser(bytes.NewReader(out))
	r.ContentLength = int64(len(out))
	r.Header.Set("Content-Length", strconv.Itoa(len(out)))
	r.Header.Del("Content-Encoding")
	r.TransferEncoding = nil
	return nil
}

// prepareServiceRequest asks the API server for exactly the encoding the gate
// will edit (prepareAnswerRequest).
func prepareServiceRequest(r *http.Request, a *serviceAnswer) { prepareAnswerRequest(r, a.media) }

// modifyResponse filters the API server's answer to a Service request, and
// checks its answer to a Node GET the node cache let through (nodeanswer.go).
func (p *Proxy) modifyResponse(resp *http.Response) error {
	if err := switchesProtocols(resp); err != nil {
		return err // on every route
	}
	if n, ok := resp.Request.Context().Value(nodeAnswerKey{}).(*nodeAnswer); ok {
		return p.checkNodeAnswer(resp, n)
	}
	a, ok := resp.Request.Context().Value(serviceAnswerKey{}).(*serviceAnswer)
	if !ok {
		return nil
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated && resp.StatusCode < http.StatusBadRequest {
		// neither a Service (list, watch) the view reads nor the API
		// server's error answer: nothing is relayed raw
		return fmt.Errorf("%w: %s to a Service request", errUndecodedAnswer, resp.Status)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		if a.mode == serviceGet {
			p.metrics.requests.WithLabelValues(a.rt.kind.String(), decisionForwarded).Inc()
			if resp.StatusCode == http.StatusNotFound {
				// The gate's own 404, as for a Service outside the view: the
				// two must not be told apart.
				_ = resp.Body.Close()
				replaceWithStatus(resp, notFound(servicesResource, a.rt.name))
			}
		}
		return nil // the API server's own error answer
	}
	if got := wire.MediaOf(resp.Header.Get("Content-Type")); got != a.media {
		return fmt.Errorf("%w: %s: Content-Type %q where %q was asked for", errUndecodedAnswer, a.rt, resp.Header.Get("Content-Type"), a.media.ContentType())
	}
	resp.Header.Del("Content-Length")
	resp.ContentLength = -1
	switch a.mode {
	case serviceList:
		resp.Body = p.filterBody(resp.Body, a, func(in io.Reader, out *bufio.Writer) error {
			return serviceview.FilterList(a.media, p.serviceView, in, out)
		})
	case serviceWatch:
		resp.Body = p.filterBody(resp.Body, a, func(in io.Reader, out *bufio.Writer) error {
			// Whatever is filtered goes out before the gate waits for more.
			err := serviceview.FilterWatch(a.media, a.watch, &flushBeforeRead{r: in, w: out}, out)
			if a.watch.Ended {
				p.log.V(1).Info("ended a Service watch with 410: the Service history cannot tell what its client holds", "path", a.rt.String())
			}
			return err
		})
	case serviceGet, serviceWritten:
		return p.filterOne(resp, a)
	}
	return nil
}

// filterOne reads a single Service answer: hidden (404) outside the view for a
// get, and without its class.
func (p *Proxy) filterOne(resp *http.Response, a *serviceAnswer) error {
	body, err := readAnswer(resp.Body, service.MaxBody)
	if err != nil {
		return fmt.Errorf("%s: %w", a.rt, err)
	}
	svc, err := service.ReadOne(a.media, body, p.serviceView.Class)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", errUndecodedAnswer, a.rt, err)
	}
	shown := p.serviceView.Shows(svc.Facts)
	switch {
	case a.mode == serviceGet && !shown:
		p.metrics.requests.WithLabelValues(a.rt.kind.String(), decisionHidden).Inc()
		p.log.V(2).Info("Service outside the view", "service", a.rt.namespace+"/"+a.rt.name)
		replaceWithStatus(resp, notFound(servicesResource, a.rt.name))
		return nil
	case a.mode == serviceGet:
		p.metrics.requests.WithLabelValues(a.rt.kind.String(), decisionForwarded).Inc()
		body = serviceview.SingleAnswer(a.media, svc)
	case shown:
		body = serviceview.SingleAnswer(a.media, svc)
	default:
		// The write took the Service out of the view: the CCM learns that
		// it is gone, not what it became.
		if body, err = serviceview.TombstoneAnswer(a.media, svc.Facts); err != nil {
			return err
		}
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	return nil
}

// filterBody runs filter between the API server's body and the client in a
// goroutine; it ends when either side does.
func (p *Proxy) filterBody(upstream io.ReadCloser, a *serviceAnswer, filter func(in io.Reader, out *bufio.Writer) error) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		out := bufio.NewWriterSize(pw, 32<<10)
		err := filter(upstream, out)
		if err == nil {
			err = out.Flush()
		}
		if err != nil && !errors.Is(err, io.ErrClosedPipe) && !errors.Is(err, context.Canceled) {
			p.metrics.requests.WithLabelValues(a.rt.kind.String(), decisionError).Inc()
			p.log.Error(err, "filtering Services failed", "path", a.rt.String())
		}
		_ = pw.CloseWithError(err)
		_ = upstream.Close()
	}()
	return &filteredBody{pr: pr, upstream: upstream}
}

type filteredBody struct {
	pr       *io.PipeReader
	upstream io.Closer
}

func (b *filteredBody) Read(p []byte) (int, error) { return b.pr.Read(p) }

func (b *filteredBody) Close() error {
	_ = b.pr.Close()
	return b.upstream.Close()
}

// flushBeforeRead flushes w whenever the filter is about to wait for the API
// server, so a watch event never waits in the gate for the next one.
type flushBeforeRead struct {
	r io.Reader
	w *bufio.Writer
}

func (f *flushBeforeRead) Read(p []byte) (int, error) {
	if f.w.Buffered() > 0 {
		if err := f.w.Flush(); err != nil {
			return 0, err
		}
	}
	return f.r.Read(p)
}

// readService reads a Service (a quorum read) with the credentials of the
// request being checked. found is false on 404.
func (p *Proxy) readService(ctx context.Context, in http.Header, namespace, name string) (service.Facts, bool, error) {
	const op = "proxy/Proxy.readService"
	u := *p.base
	u.Path = joinPath(p.base.Path, "/api/v1/namespaces/"+url.PathEscape(namespace)+"/services/"+url.PathEscape(name))
	u.RawPath = ""
	body, found, err := p.read(ctx, in, u.String(), wire.ContentTypeJSON, service.MaxBody)
	if err != nil || !found {
		return service.Facts{}, false, err
	}
	svc, err := service.ReadOne(wire.MediaJSON, body, "")
	if err != nil {
		return service.Facts{}, false, fmt.Errorf("%s: decode service %s/%s: %w", op, namespace, name, err)
	}
	return svc.Facts, true, nil
}
