package coordinatorscale

import (
	"maps"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"

	"k8s.io/client-go/rest"
)

// counter is a reverse proxy in front of the API server that the coordinator
// uses as its API server: it forwards every request with the credentials of
// upstream and counts them by verb and resource, so that the figures are the
// coordinator's own requests and nobody else's.
type counter struct {
	proxy *httputil.ReverseProxy

	mu     sync.Mutex
	counts map[string]int
	// helmReads counts reads of Helm's release storage (Secrets labelled
	// owner=helm, or named sh.helm.release.v1.*) apart from the informer's
	// namespace-wide list and watch.
	helmReads int
}

func newCounter(upstream *rest.Config) (*counter, error) {
	target, err := url.Parse(upstream.Host)
	if err != nil {
		return nil, err
	}
	transport, err := rest.TransportFor(upstream)
	if err != nil {
		return nil, err
	}
	c := &counter{counts: map[string]int{}}
	c.proxy = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = target.Host
		},
		Transport: transport,
		// watches stream
		FlushInterval: -1,
	}
	return c, nil
}

func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	verb, resource, helm := classify(r)
	c.mu.Lock()
	c.counts[verb+" "+resource]++
	if helm {
		c.helmReads++
	}
	c.mu.Unlock()
	c.proxy.ServeHTTP(w, r)
}

// snapshot is the counts so far.
type snapshot struct {
	counts    map[string]int
	helmReads int
}

func (c *counter) snapshot() snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return snapshot{counts: maps.Clone(c.counts), helmReads: c.helmReads}
}

// since is what happened between an earlier snapshot and this one.
func (s snapshot) since(earlier snapshot) snapshot {
	d := snapshot{counts: map[string]int{}, helmReads: s.helmReads - earlier.helmReads}
	for k, v := range s.counts {
		if n := v - earlier.counts[k]; n > 0 {
			d.counts[k] = n
		}
	}
	return d
}

func (s snapshot) total() int {
	n := 0
	for _, v := range s.counts {
		n += v
	}
	return n
}

// keys are the "verb resource" keys, most requests first.
func (s snapshot) keys() []string {
	k := slices.Collect(maps.Keys(s.counts))
	slices.SortFunc(k, func(a, b string) int {
		if d := s.counts[b] - s.counts[a]; d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	return k
}

// classify names a request's verb (get, list, watch, create, update, patch,
// delete) and resource (resource[/subresource], or the path of a
// non-resource request), and whether it reads Helm's release storage.
func classify(r *http.Request) (verb, resource string, helmRead bool) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	var rest []string
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		rest = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		rest = parts[3:]
	default:
		return strings.ToLower(r.Method), "/" + strings.Join(parts, "/"), false
	}
	if len(rest) >= 2 && rest[0] == "namespaces" && len(rest) > 2 {
		rest = rest[2:]
	}
	if len(rest) == 0 {
		return strings.ToLower(r.Method), "/" + strings.Join(parts, "/"), false
	}
	resource = rest[0]
	name := ""
	if len(rest) >= 2 {
		name = rest[1]
	}
	if len(rest) >= 3 {
		resource += "/" + rest[2]
	}
	q := r.URL.Query()
	switch r.Method {
	case http.MethodGet:
		switch {
		case q.Get("watch") == "true" || q.Get("watch") == "1":
			verb = "watch"
		case name == "":
			verb = "list"
		default:
			verb = "get"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
	default:
		verb = strings.ToLower(r.Method)
	}
	if resource == "secrets" && (verb == "get" || verb == "list") {
		helmRead = strings.HasPrefix(name, "sh.helm.release.v1.") || strings.Contains(q.Get("labelSelector"), "owner=helm")
	}
	return verb, resource, helmRead
}
