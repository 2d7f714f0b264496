package proxy

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// routeKind is what a request path means to the view.
type routeKind int

const (
	// routeOther is anything that is not about Nodes: forwarded unchanged.
	routeOther routeKind = iota
	// routeNodes is the Node collection, /api/v1/nodes (list, watch, create,
	// deletecollection).
	routeNodes
	// routeWatchNodes is the legacy watch path /api/v1/watch/nodes[/{name}].
	routeWatchNodes
	// routeNode is one Node or one of its subresources, /api/v1/nodes/{name}[/...].
	routeNode
	// routeLegacyProxy is /api/v1/proxy/nodes/..., long removed from the API server.
	routeLegacyProxy
	// routeServices is a Service collection: /api/v1/services or
	// /api/v1/namespaces/{namespace}/services (list, watch, create,
	// deletecollection).
	routeServices
	// routeWatchServices is the legacy watch path
	// /api/v1/watch/[namespaces/{namespace}/]services[/{name}].
	routeWatchServices
	// routeService is one Service or one of its subresources,
	// /api/v1/namespaces/{namespace}/services/{name}[/...].
	routeService
)

// String names the route in metrics and logs.
func (k routeKind) String() string {
	switch k {
	case routeNodes:
		return "nodes"
	case routeWatchNodes:
		return "watch-nodes"
	case routeNode:
		return "node"
	case routeLegacyProxy:
		return "legacy-proxy"
	case routeServices:
		return "services"
	case routeWatchServices:
		return "watch-services"
	case routeService:
		return "service"
	default:
		return "other"
	}
}

// String names the route's object in logs.
func (r route) String() string {
	s := r.kind.String()
	if r.namespace != "" {
		s += " " + r.namespace
	}
	if r.name != "" {
		s += "/" + r.name
	}
	if r.subresource != "" {
		s += "/" + r.subresource
	}
	return s
}

// route is a classified request path.
type route struct {
	kind routeKind
	// namespace of a Service route ("" for all namespaces).
	namespace string
	// name of the Node or Service (routeNode, routeService, and the watch
	// routes for a single object).
	name string
	// subresource is the rest of the path after the name ("status", "proxy/...").
	subresource string
}

// classify maps a request URL to a route. Paths the API server could read
// differently from the gate (escaped slashes, dot segments, empty segments) are
// errors for every route, so that what the gate checks is what the API server
// serves.
func classify(u *url.URL) (route, error) {
	p := u.Path
	if u.RawPath != "" {
		return route{}, fmt.Errorf("path %q contains escaped characters", u.EscapedPath())
	}
	if !strings.HasPrefix(p, "/") {
		return route{}, fmt.Errorf("path %q is not absolute", p)
	}
	var segs []string
	empty := false
	for _, s := range strings.Split(p[1:], "/") {
		switch s {
		case ".", "..":
			return route{}, fmt.Errorf("path %q contains dot segments", p)
		case "":
			empty = true
		default:
			segs = append(segs, s)
		}
	}
	if len(segs) < 3 || segs[0] != "api" || segs[1] != "v1" {
		return route{kind: routeOther}, nil
	}
	if empty && (segs[2] == "nodes" || segs[2] == "watch" || segs[2] == "proxy" || slices.Contains(segs, "services")) {
		// "//" or a trailing slash: the gate must read these paths exactly as the
		// API server does, so it reads only the canonical form.
		return route{}, fmt.Errorf("path %q contains an empty segment", p)
	}
	switch segs[2] {
	case "nodes":
		if len(segs) == 3 {
			return route{kind: routeNodes}, nil
		}
		return route{kind: routeNode, name: segs[3], subresource: strings.Join(segs[4:], "/")}, nil
	case "services":
		if len(segs) == 3 {
			return route{kind: routeServices}, nil
		}
		// /api/v1/services/{name} does not exist: the API server answers it.
	case "namespaces":
		if len(segs) >= 5 && segs[4] == "services" {
			if len(segs) == 5 {
				return route{kind: routeServices, namespace: segs[3]}, nil
			}
			return route{kind: routeService, namespace: segs[3], name: segs[5], subresource: strings.Join(segs[6:], "/")}, nil
		}
	case "watch":
		if len(segs) >= 4 && segs[3] == "services" {
			if len(segs) == 4 {
				return route{kind: routeWatchServices}, nil
			}
			return route{}, fmt.Errorf("path %q: watch of one Service needs its namespace", p)
		}
		if len(segs) >= 6 && segs[3] == "namespaces" && segs[5] == "services" {
			switch len(segs) {
			case 6:
				return route{kind: routeWatchServices, namespace: segs[4]}, nil
			case 7:
				return route{kind: routeWatchServices, namespace: segs[4], name: segs[6]}, nil
			default:
				return route{}, fmt.Errorf("path %q: watch of a Service subresource", p)
			}
		}
		if len(segs) >= 4 && segs[3] == "nodes" {
			switch len(segs) {
			case 4:
				return route{kind: routeWatchNodes}, nil
			case 5:
				return route{kind: routeWatchNodes, name: segs[4]}, nil
			default:
				return route{}, fmt.Errorf("path %q: watch of a node subresource", p)
			}
		}
	case "proxy":
		if len(segs) >= 4 && segs[3] == "nodes" {
			return route{kind: routeLegacyProxy}, nil
		}
	}
	return route{kind: routeOther}, nil
}

// joinPath joins a base path and an absolute path.
func joinPath(a, b string) string {
	return strings.TrimSuffix(a, "/") + b
}
