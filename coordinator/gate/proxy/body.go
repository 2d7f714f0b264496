package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// maxRequestBody bounds a request body the gate forwards: the API server's
// own limit for a write (3 MiB, --max-request-body-bytes' default). A native
// CCM writes Nodes, Services, Events and Leases, each far smaller.
const maxRequestBody = 3 << 20

// errBodyTooLarge: a request body above maxRequestBody.
var errBodyTooLarge = errors.New("request body too large")

// readBody reads r's whole body before anything is forwarded, so the request
// the API server receives has a body of known length the gate already holds.
// Streaming it instead ties the upstream request to the client's connection:
// when the API server answers before it reads the body (a 403 from
// authorization does), Go's HTTP/2 transport waits, on closing the answer,
// for the goroutine still copying the client's body, and the client waits for
// the end of an answer that never comes (seen as a request hanging until the
// client's deadline).
func readBody(r *http.Request) error {
	if r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	if r.ContentLength > maxRequestBody {
		return fmt.Errorf("%w: %d bytes, at most %d", errBodyTooLarge, r.ContentLength, maxRequestBody)
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, maxRequestBody+1))
	_ = r.Body.Close()
	if err != nil {
		return fmt.Errorf("read request body: %w", err)
	}
	if len(b) > maxRequestBody {
		return fmt.Errorf("%w: more than %d bytes", errBodyTooLarge, maxRequestBody)
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	r.ContentLength = int64(len(b))
	r.TransferEncoding = nil
	if len(b) == 0 {
		r.Body = http.NoBody
		r.Header.Del("Content-Length")
		return nil
	}
	r.Header.Set("Content-Length", strconv.Itoa(len(b)))
	return nil
}

// bodyRefused answers a body readBody would not take.
func bodyRefused(err error) metav1.Status {
	if errors.Is(err, errBodyTooLarge) {
		return metav1.Status{
			Code:    http.StatusRequestEntityTooLarge,
			Reason:  metav1.StatusReasonRequestEntityTooLarge,
			Message: "ccm-gate: " + err.Error(),
		}
	}
	return badRequest(err)
}
