package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// nodeMeta is what the view needs to know about one Node.
type nodeMeta struct {
	UID             string
	ResourceVersion string
	// Labels of the Node (the cache keeps only those the view selects on).
	Labels map[string]string
}

// upstreamError is a non-404 error answer of the API server to the gate's own
// read; it is relayed to the client as it came (e.g. 401, 403, 429).
type upstreamError struct {
	code        int
	contentType string
	body        []byte
}

func (e *upstreamError) Error() string {
	return fmt.Sprintf("API server answered %d: %s", e.code, e.body)
}

// maxNodeBody bounds the gate's read of one Node's metadata.
const maxNodeBody = 4 << 20

// partialObjectMetadataJSON asks for a Node's metadata only.
const partialObjectMetadataJSON = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"

// readNode reads a Node's metadata from the API server (a quorum read) with the
// credentials of the request being checked. found is false on 404.
func (p *Proxy) readNode(ctx context.Context, in http.Header, name string) (meta nodeMeta, found bool, err error) {
	const op = "proxy/Proxy.readNode"
	u := *p.base
	u.Path = joinPath(p.base.Path, "/api/v1/nodes/"+url.PathEscape(name))
	u.RawPath = ""
	body, found, err := p.read(ctx, in, u.String(), partialObjectMetadataJSON, maxNodeBody)
	if err != nil || !found {
		return nodeMeta{}, false, err
	}
	var obj metav1.PartialObjectMetadata
	if err := json.Unmarshal(body, &obj); err != nil {
		return nodeMeta{}, false, fmt.Errorf("%s: decode node %s: %w", op, name, err)
	}
	return nodeMeta{UID: string(obj.UID), ResourceVersion: obj.ResourceVersion, Labels: obj.Labels}, true, nil
}

// read GETs u from the API server with the credentials of the request being
// checked (in), for the gate's own check. found is false on 404; any other
// error answer is an *upstreamError.
func (p *Proxy) read(ctx context.Context, in http.Header, u, accept string, limit int64) (body []byte, found bool, err error) {
	const op = "proxy/Proxy.read"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, false, fmt.Errorf("%s: %w", op, err)
	}
	for k, v := range in {
		if credentialHeader(k) {
			req.Header[k] = v
		}
	}
	req.Header.Set("Accept", accept)
	if ua := in.Get("User-Agent"); ua != "" {
		req.Header.Set("User-Agent", ua+" (ccm-gate check)")
	}
	resp, err := p.transport.RoundTrip(req)
	if err != nil {
		return nil, false, fmt.Errorf("%s: %w", op, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err = io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return nil, false, fmt.Errorf("%s: read %s: %w", op, u, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return body, true, nil
	case http.StatusNotFound:
		return nil, false, nil
	default:
		return nil, false, &upstreamError{code: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: body}
	}
}

// nodeCache holds the names of the domain's Nodes, from a label-selected
// metadata watch with the gate's own credentials (the pod's ServiceAccount).
type nodeCache struct {
	informer cache.SharedIndexInformer
}

var nodesGVR = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}

// cachePageSize bounds how many nodes' metadata the cache decodes at once.
const cachePageSize = 250

func newNodeCache(cfg *rest.Config, reqs labels.Requirements) (*nodeCache, error) {
	mc, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	selector := labels.NewSelector().Add(reqs...).String()
	keys := make([]string, 0, len(reqs))
	for _, r := range reqs {
		keys = append(keys, r.Key())
	}
	nodes := mc.Resource(nodesGVR)
	// Keep only what the view reads: a few hundred bytes per node. Stripping
	// happens per page and per event, so the full metadata (managed fields,
	// annotations) of many nodes is never held at once.
	strip := func(m *metav1.PartialObjectMetadata) {
		kept := make(map[string]string, len(keys))
		for _, k := range keys {
			if v, ok := m.Labels[k]; ok {
				kept[k] = v
			}
		}
		m.ObjectMeta = metav1.ObjectMeta{
			Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion,
			Labels: kept,
		}
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			// A consistent, paginated read: a resourceVersion=0 list would come
			// from the watch cache in one piece, however many nodes there are.
			o.ResourceVersion, o.ResourceVersionMatch = "", ""
			if o.Limit == 0 || o.Limit > cachePageSize {
				o.Limit = cachePageSize
			}
			l, err := nodes.List(ctx, o)
			if err != nil {
				return nil, err
			}
			for i := range l.Items {
				strip(&l.Items[i])
			}
			return l, nil
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			w, err := nodes.Watch(ctx, o)
			if err != nil {
				return nil, err
			}
			return watch.Filter(w, func(ev watch.Event) (watch.Event, bool) {
				if m, ok := ev.Object.(*metav1.PartialObjectMetadata); ok && ev.Type != watch.Bookmark {
					strip(m)
				}
				return ev, true
			}), nil
		},
	}
	inf := cache.NewSharedIndexInformer(lw, &metav1.PartialObjectMetadata{}, 0, cache.Indexers{})
	return &nodeCache{informer: inf}, nil
}

func (c *nodeCache) run(ctx context.Context) { c.informer.RunWithContext(ctx) }

func (c *nodeCache) synced() bool { return c.informer.HasSynced() }

// waitSynced waits until the first list is in the cache.
func (c *nodeCache) waitSynced(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), c.informer.HasSynced)
}

func (c *nodeCache) get(name string) (nodeMeta, bool) {
	o, ok, err := c.informer.GetStore().GetByKey(name)
	if err != nil || !ok {
		return nodeMeta{}, false
	}
	m := o.(*metav1.PartialObjectMetadata)
	return nodeMeta{UID: string(m.UID), ResourceVersion: m.ResourceVersion, Labels: m.Labels}, true
}

// since reports how long ago start was, for check latency metrics.
func since(start time.Time) float64 { return time.Since(start).Seconds() }
