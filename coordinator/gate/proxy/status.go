package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	nodesResource    = schema.GroupResource{Resource: "nodes"}
	servicesResource = schema.GroupResource{Resource: "services"}
)

// statusBody encodes s as the API server would.
func statusBody(s metav1.Status) []byte {
	s.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	s.Status = metav1.StatusFailure
	b, err := json.Marshal(s)
	if err != nil {
		return []byte(s.Message)
	}
	return b
}

// replaceWithStatus turns an API server's answer into s.
func replaceWithStatus(resp *http.Response, s metav1.Status) {
	b := statusBody(s)
	resp.StatusCode = int(s.Code)
	resp.Status = strconv.Itoa(int(s.Code)) + " " + http.StatusText(int(s.Code))
	resp.Body = io.NopCloser(bytes.NewReader(b))
	resp.ContentLength = int64(len(b))
	resp.Header.Set("Content-Type", "application/json")
	resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
	resp.Header.Del("Content-Encoding")
}

// hideAnswer turns an API server's answer into s, with nothing of the API
// server's answer left: its headers go too, so that the answer is the one
// writeStatus gives (hide), byte for byte but for the Date.
func hideAnswer(resp *http.Response, s metav1.Status) {
	resp.Header = http.Header{}
	resp.Trailer = nil
	replaceWithStatus(resp, s)
	resp.Header.Set("X-Content-Type-Options", "nosniff")
}

// writeStatus answers with a metav1.Status like the API server's own, so that
// clients (client-go's apierrors.IsNotFound, IsForbidden, ...) read it as usual.
func writeStatus(w http.ResponseWriter, s metav1.Status) {
	s.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	s.Status = metav1.StatusFailure
	b, err := json.Marshal(s)
	if err != nil {
		http.Error(w, s.Message, int(s.Code))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(int(s.Code))
	_, _ = w.Write(b)
}

// notFound is the API server's answer for an object that does not exist. A
// Node or Service outside the view does not exist for the CCM.
func notFound(gr schema.GroupResource, name string) metav1.Status {
	return apierrors.NewNotFound(gr, name).ErrStatus
}

// forbidden refuses a request the gate never forwards.
func forbidden(gr schema.GroupResource, verb, name string, reason error) metav1.Status {
	return apierrors.NewForbidden(gr, name, fmt.Errorf("ccm-gate refuses %s: %w", verb, reason)).ErrStatus
}

// expired is the API server's answer to a resourceVersion or continue token it
// no longer serves: a client lists again.
func expired(why string) metav1.Status {
	return metav1.Status{Code: http.StatusGone, Reason: metav1.StatusReasonExpired, Message: "ccm-gate: " + why}
}

func badRequest(err error) metav1.Status {
	return apierrors.NewBadRequest("ccm-gate: " + err.Error()).ErrStatus
}

func methodNotAllowed(gr schema.GroupResource, method, path string) metav1.Status {
	return apierrors.NewMethodNotSupported(gr, method+" "+path).ErrStatus
}

// notAcceptable answers a Service request whose Accept header allows neither
// JSON nor protobuf objects.
func notAcceptable(accept string) metav1.Status {
	return metav1.Status{
		Code:    http.StatusNotAcceptable,
		Reason:  metav1.StatusReasonNotAcceptable,
		Message: fmt.Sprintf("ccm-gate: Accept %q: the view serves Services as JSON or protobuf objects only (no Table, no PartialObjectMetadata)", accept),
	}
}

// unsupportedMediaType answers a Service PUT in an encoding the gate cannot edit.
func unsupportedMediaType(contentType string) metav1.Status {
	return metav1.Status{
		Code:    http.StatusUnsupportedMediaType,
		Reason:  metav1.StatusReasonUnsupportedMediaType,
		Message: fmt.Sprintf("ccm-gate: Content-Type %q: a Service is written through the view as JSON or protobuf", contentType),
	}
}

func badGateway(err error) metav1.Status {
	return metav1.Status{
		Code:    http.StatusBadGateway,
		Reason:  metav1.StatusReasonServiceUnavailable,
		Message: "ccm-gate: API server unreachable: " + err.Error(),
	}
}

// refusedAnswer replaces an answer of the API server that the gate does not
// relay: one it does not decode (errUndecodedAnswer) or one too large to
// check (errAnswerTooLarge). The API server was reached; its answer is what
// the message names.
func refusedAnswer(err error) metav1.Status {
	return metav1.Status{
		Code:    http.StatusBadGateway,
		Reason:  metav1.StatusReasonInternalError,
		Message: "ccm-gate: " + err.Error(),
	}
}

// nodeChangedDuringRead answers a held read of a Node (nodehold.go) that
// changed between the gate's reads on every attempt: the client reads again
// (client-go does, after Retry-After).
func nodeChangedDuringRead(name string, attempts int) metav1.Status {
	return metav1.Status{
		Code:    http.StatusServiceUnavailable,
		Reason:  metav1.StatusReasonServiceUnavailable,
		Message: fmt.Sprintf("ccm-gate: node %q changed during the read (%d attempts): the gate shows no answer it could not check; read it again", name, attempts),
		Details: &metav1.StatusDetails{Name: name, Kind: nodesResource.Resource, RetryAfterSeconds: 1},
	}
}

// unauthorized answers a request without the gate's client token.
func unauthorized() metav1.Status {
	return apierrors.NewUnauthorized("ccm-gate: this proxy accepts only its pod's client token").ErrStatus
}
