package proxy

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// A native CCM needs no protocol upgrade: it lists, watches and writes over
// plain HTTP. An upgraded connection (WebSocket, SPDY, h2c) would carry
// frames the gate does not decode, so a watch over WebSocket would go around
// the view; the gate refuses every upgrade request, on every route, and
// fails closed on any answer that switches protocols.

// errUndecodedAnswer: the API server answered with something the gate does
// not decode (a 101 Switching Protocols, a status a Service route has no
// reading for, a Node or Service in another Content-Type than the one asked
// for, or one the gate cannot read); relaying it raw could carry what the
// view hides.
var errUndecodedAnswer = errors.New("the gate cannot decode the API server's answer, and does not relay it")

// upgradeRequest says why r asks to switch protocols, or "" if it does not:
// an Upgrade header (WebSocket, SPDY, h2c), a Connection header naming
// upgrade, an HTTP2-Settings header (h2c), or a CONNECT (HTTP/2 extended
// CONNECT carries WebSocket).
func upgradeRequest(r *http.Request) string {
	if r.Method == http.MethodConnect {
		return "CONNECT requests (WebSocket over HTTP/2) are not served"
	}
	if v := r.Header.Values("Upgrade"); len(v) > 0 {
		return fmt.Sprintf("protocol upgrades (Upgrade: %q) are not served", clipHeader(strings.Join(v, ", ")))
	}
	for _, v := range r.Header.Values("Connection") {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return "protocol upgrades (Connection: upgrade) are not served"
			}
		}
	}
	if len(r.Header.Values("Http2-Settings")) > 0 {
		return "h2c upgrades (HTTP2-Settings) are not served"
	}
	return ""
}

// refuseUpgrade answers an upgrade request 403 Forbidden.
func (p *Proxy) refuseUpgrade(w http.ResponseWriter, r *http.Request, rt route, why string) {
	gr := schema.GroupResource{}
	switch rt.kind {
	case routeNodes, routeWatchNodes, routeNode:
		gr = nodesResource
	case routeServices, routeWatchServices, routeService:
		gr = servicesResource
	}
	p.refuse(w, r, rt, forbidden(gr, "upgrade", "", errors.New(why)))
}

// switchesProtocols reports whether resp is an informational answer the gate
// must not relay (101 Switching Protocols above all).
func switchesProtocols(resp *http.Response) error {
	if resp.StatusCode < http.StatusOK {
		return fmt.Errorf("%w: %s", errUndecodedAnswer, resp.Status)
	}
	return nil
}

func clipHeader(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "…"
}
