package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var nodesResource = schema.GroupResource{Resource: "nodes"}

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

// notFound is the API server's answer for a Node that does not exist. A Node
// outside the view does not exist for the CCM.
func notFound(name string) metav1.Status {
	return apierrors.NewNotFound(nodesResource, name).ErrStatus
}

// forbidden refuses a request the gate never forwards.
func forbidden(verb, name string, reason error) metav1.Status {
	return apierrors.NewForbidden(nodesResource, name, fmt.Errorf("ccm-gate refuses %s: %w", verb, reason)).ErrStatus
}

func badRequest(err error) metav1.Status {
	return apierrors.NewBadRequest("ccm-gate: " + err.Error()).ErrStatus
}

func methodNotAllowed(method, path string) metav1.Status {
	return apierrors.NewMethodNotSupported(nodesResource, method+" "+path).ErrStatus
}

func badGateway(err error) metav1.Status {
	return metav1.Status{
		Code:    http.StatusBadGateway,
		Reason:  metav1.StatusReasonServiceUnavailable,
		Message: "ccm-gate: API server unreachable: " + err.Error(),
	}
}

// unauthorized answers a request without the gate's client token.
func unauthorized() metav1.Status {
	return apierrors.NewUnauthorized("ccm-gate: this proxy accepts only its pod's client token").ErrStatus
}
