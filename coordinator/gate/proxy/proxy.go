package proxy

import (
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/nodeview"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/serviceview"
)

// CredentialMode says whose credentials reach the API server.
type CredentialMode string

const (
	// ForwardCredentials forwards the caller's Authorization and impersonation
	// headers and adds none: the API server sees the CCM itself. The default.
	ForwardCredentials CredentialMode = "forward"
	// OwnCredentials drops the caller's credentials and authenticates with the
	// gate's own (Config.Upstream). Use it only when the CCM's credentials cannot
	// travel through a proxy (client certificates) and the gate's identity is the
	// CCM's: anyone who can reach the listener acts with that identity.
	OwnCredentials CredentialMode = "own"
)

// Config configures a Proxy.
type Config struct {
	// Upstream is the API server. Its credentials are the gate's own: used for
	// the node cache, and for every request with OwnCredentials.
	Upstream *rest.Config
	// Platform is the value of the platform label this view shows.
	Platform string
	// PlatformLabel is the routing label key; default names.PlatformLabel.
	PlatformLabel string
	// DomainSelector narrows the view to the platform's nodes in the CCM's
	// ownership domain (for example topology.kubernetes.io/region=eu-west-1):
	// a Kubernetes label selector of equality and set requirements, ANDed with
	// platform=<Platform>. Empty: every node of the platform.
	DomainSelector string
	// Credentials is ForwardCredentials (default) or OwnCredentials.
	Credentials CredentialMode
	// ClientToken, when set, is the only credential the proxy accepts: every
	// request must carry "Authorization: Bearer <ClientToken>" and is answered
	// 401 otherwise. It requires OwnCredentials: the token means nothing to
	// the API server, and the gate's own credentials replace it. This is how the
	// view becomes a boundary: the CCM holds only this per-pod secret, which no
	// API server accepts, and the ServiceAccount token stays in the gate.
	ClientToken []byte
	// LoadBalancerClass is the spec.loadBalancerClass of the Services this
	// CCM serves: it sees those Services of type LoadBalancer, without their
	// class. Empty: it sees no Service at all.
	LoadBalancerClass string
	// DefaultLoadBalancerClass makes the CCM also serve Services of type
	// LoadBalancer without a class (requires LoadBalancerClass).
	DefaultLoadBalancerClass bool
	// DisableCache makes every single-node check a read from the API server.
	// (The history of the Services in the view is kept regardless: the view
	// of Services needs it.)
	DisableCache bool
	// StartupAccess is what the gate's own identity (the CCM's, with
	// OwnCredentials) must be allowed before Ready reports true for the first
	// time: the gate asks SelfSubjectAccessReviews until all are allowed, and
	// never again. Empty: no such wait.
	StartupAccess []Access
	// Registerer receives the gate's metrics; nil: none.
	Registerer prometheus.Registerer
	// Log is the logger; default klog.Background().
	Log logr.Logger
}

// Proxy is the node view: an http.Handler in front of the API server.
type Proxy struct {
	cfg          Config
	log          logr.Logger
	base         *url.URL
	transport    http.RoundTripper
	requirements labels.Requirements
	selector     labels.Selector
	cache        *nodeCache
	serviceView  serviceview.View
	history      *serviceview.History
	rp           *httputil.ReverseProxy
	metrics      *metrics
	access       *accessGate
	// bodies is the budget of the request bodies the gate holds at once.
	bodies *semaphore.Weighted
	// answers is the budget of the API server's answers the gate holds
	// whole at once.
	answers *semaphore.Weighted
}

var _ http.Handler = (*Proxy)(nil)

// New validates cfg and builds the proxy. Call Start before serving.
func New(cfg Config) (*Proxy, error) {
	const op = "proxy.New"
	if cfg.Upstream == nil {
		return nil, fmt.Errorf("%s: no upstream API server", op)
	}
	if cfg.Platform == "" {
		return nil, fmt.Errorf("%s: no platform: an empty platform would show every unlabelled node", op)
	}
	if cfg.PlatformLabel == "" {
		cfg.PlatformLabel = names.PlatformLabel
	}
	switch cfg.Credentials {
	case "":
		cfg.Credentials = ForwardCredentials
	case ForwardCredentials, OwnCredentials:
	default:
		return nil, fmt.Errorf("%s: credentials mode %q: want %q or %q", op, cfg.Credentials, ForwardCredentials, OwnCredentials)
	}
	if len(cfg.ClientToken) > 0 && cfg.Credentials != OwnCredentials {
		return nil, fmt.Errorf("%s: a client token needs credentials mode %q: the API server would see the client token", op, OwnCredentials)
	}
	if len(cfg.ClientToken) > 0 && len(cfg.ClientToken) < minClientToken {
		return nil, fmt.Errorf("%s: client token of %d bytes: want at least %d", op, len(cfg.ClientToken), minClientToken)
	}
	if cfg.Log.GetSink() == nil {
		cfg.Log = klog.Background()
	}
	reqs, err := nodeview.ViewRequirements(cfg.PlatformLabel, cfg.Platform, cfg.DomainSelector)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	view, err := serviceview.NewView(cfg.LoadBalancerClass, cfg.DefaultLoadBalancerClass)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	base, err := upstreamURL(cfg.Upstream)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	forwardCfg := rest.CopyConfig(cfg.Upstream)
	if cfg.Credentials == ForwardCredentials {
		// TLS trust only: the caller's credentials travel, the gate's never do.
		forwardCfg = rest.AnonymousClientConfig(cfg.Upstream)
	}
	transport, err := rest.TransportFor(forwardCfg)
	if err != nil {
		return nil, fmt.Errorf("%s: upstream transport: %w", op, err)
	}
	p := &Proxy{
		cfg:          cfg,
		log:          cfg.Log.WithValues("platform", cfg.Platform),
		base:         base,
		transport:    transport,
		requirements: reqs,
		selector:     labels.NewSelector().Add(reqs...),
		serviceView:  view,
		metrics:      newMetrics(cfg.Registerer),
		bodies:       newBodyBudget(),
		answers:      newAnswerBudget(),
	}
	if p.access, err = newAccessGate(cfg.Upstream, cfg.StartupAccess); err != nil {
		return nil, fmt.Errorf("%s: startup access: %w", op, err)
	}
	if !cfg.DisableCache {
		if p.cache, err = newNodeCache(cfg.Upstream, reqs); err != nil {
			return nil, fmt.Errorf("%s: node cache: %w", op, err)
		}
	}
	if !view.ShowsNone {
		// Not a cache: without it a watch could not tell which Services its
		// client holds.
		if p.history, err = serviceview.NewHistory(cfg.Upstream, base, view); err != nil {
			return nil, fmt.Errorf("%s: service history: %w", op, err)
		}
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        func(pr *httputil.ProxyRequest) { pr.SetURL(p.base) },
		Transport:      transport,
		FlushInterval:  -1, // watches and large lists stream through as they come
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.upstreamFailed,
	}
	return p, nil
}

func upstreamURL(cfg *rest.Config) (*url.URL, error) {
	host := cfg.Host
	if host == "" {
		return nil, errors.New("upstream has no host")
	}
	if !strings.Contains(host, "://") {
		scheme := "https"
		if cfg.Insecure && len(cfg.CAData) == 0 && cfg.CAFile == "" && len(cfg.CertData) == 0 && cfg.CertFile == "" {
			scheme = "http"
		}
		host = scheme + "://" + host
	}
	u, err := url.Parse(host)
	if err != nil {
		return nil, fmt.Errorf("upstream host %q: %w", cfg.Host, err)
	}
	u.Path = strings.TrimSuffix(u.Path+cfg.APIPath, "/")
	return u, nil
}

// Start runs the node cache and the history of Services in the view until ctx
// ends, and waits for their first lists.
func (p *Proxy) Start(ctx context.Context) error {
	go p.access.run(ctx, p)
	if p.history != nil {
		go p.history.Run(ctx)
	}
	if p.cache != nil {
		go p.cache.run(ctx)
		if !p.cache.waitSynced(ctx) {
			return fmt.Errorf("proxy.Start: node cache not synced: %w", ctx.Err())
		}
		p.log.Info("node cache synced")
	}
	if p.history != nil {
		if !p.history.WaitSynced(ctx) {
			return fmt.Errorf("proxy.Start: Service history not synced: %w", ctx.Err())
		}
		p.log.Info("Service history synced")
	}
	return nil
}

// Ready reports whether the view can answer (the caches, if any, have
// synced) and the CCM may start: its identity has been allowed everything of
// Config.StartupAccess.
func (p *Proxy) Ready() bool {
	return (p.cache == nil || p.cache.synced()) && (p.history == nil || p.history.Synced()) && p.access.ready.Load()
}

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if len(p.cfg.ClientToken) > 0 && !p.authenticated(r) {
		p.metrics.requests.WithLabelValues(routeUnauthenticated, decisionRefused).Inc()
		p.log.V(1).Info("refused request without the client token", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
		writeStatus(w, unauthorized())
		return
	}
	rt, err := classify(r.URL)
	if err != nil {
		p.refuse(w, r, rt, badRequest(err))
		return
	}
	if why := upgradeRequest(r); why != "" {
		p.refuseUpgrade(w, r, rt, why)
		return
	}
	release, err := p.readBody(w, r)
	defer release()
	if err != nil {
		p.refuse(w, r, rt, bodyRefused(w, err))
		return
	}
	if p.cfg.Credentials == OwnCredentials {
		for k := range r.Header {
			if credentialHeader(k) {
				r.Header.Del(k)
			}
		}
	}
	switch rt.kind {
	case routeOther:
		p.forward(w, r, rt, decisionForwarded)
	case routeLegacyProxy:
		p.refuse(w, r, rt, forbidden(nodesResource, "proxy", "", errors.New("the legacy /api/v1/proxy/nodes path is not served")))
	case routeNodes:
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			p.filter(w, r, rt)
		case http.MethodDelete:
			p.refuse(w, r, rt, forbidden(nodesResource, "deletecollection", "", errors.New("the view cannot check every node of a collection; delete nodes one by one")))
		case http.MethodPost:
			p.refuse(w, r, rt, forbidden(nodesResource, "create", "", errors.New("a native CCM never creates nodes")))
		default:
			p.refuse(w, r, rt, methodNotAllowed(nodesResource, r.Method, r.URL.Path))
		}
	case routeWatchNodes:
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			p.refuse(w, r, rt, methodNotAllowed(nodesResource, r.Method, r.URL.Path))
			return
		}
		p.filter(w, r, rt)
	case routeNode:
		if rt.subresource == "" && r.Method == http.MethodDelete {
			p.deleteNode(w, r, rt)
			return
		}
		p.single(w, r, rt)
	case routeServices, routeWatchServices, routeService:
		p.services(w, r, rt)
	}
}

// filter injects the view's selector (platform and domain) into a list or watch and forwards it.
func (p *Proxy) filter(w http.ResponseWriter, r *http.Request, rt route) {
	q, err := nodeview.ViewSelector(r.URL.Query(), p.requirements)
	if err != nil {
		p.refuse(w, r, rt, badRequest(err))
		return
	}
	r.URL.RawQuery = q
	r.RequestURI = ""
	cw := newCoalescingWriter(w, flushWindow)
	defer cw.close()
	p.forward(cw, r, rt, decisionFiltered)
}

// single forwards a request for one Node (or one of its subresources) when the
// Node is in the view, and answers 404 otherwise. A read (GET, HEAD) shows
// the client what the view decided on (nodeanswer.go): a GET of the Node or
// its status is checked by its answer when the client prefers it in JSON or
// protobuf (forwardChecked), and held between two reads of the Node
// otherwise (forwardHeld); any other read is checked with a read of the Node.
// Those reads are quorum reads, so never by a cache that is behind what the
// client has already seen. Where the node cache does not hold the Node in the
// view, a checked GET is preceded by that read too, so that a Node outside the
// view is 404 before the API server decides on the GET (its 403 for
// nodes/status, say). A write is checked with the cache; the fence, in the
// API server, decides on the Node as it is stored.
func (p *Proxy) single(w http.ResponseWriter, r *http.Request, rt route) {
	check, media := nodeview.ReadCheckOf(r.Method, rt.subresource, r.Header.Values("Accept"))
	switch check {
	case nodeview.CheckHeld:
		p.forwardHeld(w, r, rt)
		return
	case nodeview.CheckAnswer:
		if _, ok := p.cachedInView(rt.name); ok {
			p.forwardChecked(w, r, rt, media)
			return
		}
	}
	read := r.Method == http.MethodGet || r.Method == http.MethodHead
	if _, ok := p.shown(w, r, rt, !read); !ok {
		return
	}
	if check == nodeview.CheckAnswer {
		// The Node may leave the view between the read and the GET.
		p.forwardChecked(w, r, rt, media)
		return
	}
	p.forward(w, r, rt, decisionForwarded)
}

// deleteNode checks the Node with a fresh read and forwards the DELETE with
// uid and resourceVersion preconditions of what it checked: if the Node was
// relabelled (or replaced) in between, the API server answers 409 Conflict.
func (p *Proxy) deleteNode(w http.ResponseWriter, r *http.Request, rt route) {
	meta, ok := p.shown(w, r, rt, false)
	if !ok {
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxDeleteBody+1))
	if err != nil {
		p.refuse(w, r, rt, badRequest(fmt.Errorf("read delete options: %w", err)))
		return
	}
	if len(body) > maxDeleteBody {
		p.refuse(w, r, rt, badRequest(errors.New("delete options too large")))
		return
	}
	// The API server reads DeleteOptions from the query only when there is no
	// body; the forwarded request always has one, so the query's options move
	// into it and the request means what the client asked.
	opts, query, err := requestDeleteOptions(r.URL.Query(), body, r.Header.Get("Content-Type"))
	if err != nil {
		p.refuse(w, r, rt, badRequest(err))
		return
	}
	r.URL.RawQuery = query.Encode()
	r.RequestURI = ""
	if opts.Preconditions == nil {
		opts.Preconditions = &metav1.Preconditions{}
	}
	if opts.Preconditions.UID == nil {
		uid := types.UID(meta.UID)
		opts.Preconditions.UID = &uid
	}
	if opts.Preconditions.ResourceVersion == nil {
		rv := meta.ResourceVersion
		opts.Preconditions.ResourceVersion = &rv
	}
	out, err := encodeDeleteOptions(opts)
	if err != nil {
		p.refuse(w, r, rt, badRequest(err))
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(out))
	r.ContentLength = int64(len(out))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Content-Length", strconv.Itoa(len(out)))
	r.Header.Del("Content-Encoding")
	r.TransferEncoding = nil
	p.log.V(2).Info("forwarding node delete with preconditions", "node", rt.name, "uid", meta.UID, "resourceVersion", meta.ResourceVersion)
	p.forward(w, r, rt, decisionForwarded)
}

// shown looks the route's Node up (lookup) and answers the request itself
// when it cannot go on: lookupFailed when the read failed, the gate's 404
// when the Node is outside the view (hide). ok says the caller goes on.
func (p *Proxy) shown(w http.ResponseWriter, r *http.Request, rt route, cached bool) (nodeMeta, bool) {
	meta, ok, err := p.lookup(r, rt.name, cached)
	if err != nil {
		p.lookupFailed(w, r, rt, err)
		return nodeMeta{}, false
	}
	if !ok {
		p.hide(w, r, rt)
		return nodeMeta{}, false
	}
	return meta, true
}

// lookup says whether a Node is in the view. cached allows the node cache; a
// cache miss is always confirmed by a read, so a node that just joined the
// view is never hidden by a cache that is behind.
func (p *Proxy) lookup(r *http.Request, name string, cached bool) (nodeMeta, bool, error) {
	if cached {
		if m, ok := p.cachedInView(name); ok {
			return m, true, nil
		}
	}
	start := time.Now()
	m, found, err := p.readNode(r.Context(), r.Header, name)
	p.metrics.checks.WithLabelValues(sourceAPI).Observe(since(start))
	if err != nil || !found {
		return nodeMeta{}, false, err
	}
	return m, p.inView(m), nil
}

// cachedInView says whether the node cache (once synced) has the Node in the
// view. A miss says nothing: the cache may be behind.
func (p *Proxy) cachedInView(name string) (nodeMeta, bool) {
	if p.cache == nil || !p.cache.synced() {
		return nodeMeta{}, false
	}
	start := time.Now()
	m, ok := p.cache.get(name)
	if !ok || !p.inView(m) {
		return nodeMeta{}, false
	}
	p.metrics.checks.WithLabelValues(sourceCache).Observe(since(start))
	return m, true
}

func (p *Proxy) inView(m nodeMeta) bool {
	return p.selector.Matches(labels.Set(m.Labels))
}

func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, rt route, decision string) {
	p.metrics.requests.WithLabelValues(rt.kind.String(), decision).Inc()
	p.log.V(5).Info("forwarding", "method", r.Method, "path", r.URL.Path, "query", r.URL.RawQuery, "decision", decision)
	p.rp.ServeHTTP(w, r)
}

func (p *Proxy) hide(w http.ResponseWriter, r *http.Request, rt route) {
	p.metrics.requests.WithLabelValues(rt.kind.String(), decisionHidden).Inc()
	if rt.kind == routeService {
		p.log.V(2).Info("Service outside the view", "service", rt.namespace+"/"+rt.name, "method", r.Method, "subresource", rt.subresource)
		writeStatus(w, notFound(servicesResource, rt.name))
		return
	}
	p.log.V(2).Info("node outside the view", "node", rt.name, "method", r.Method, "subresource", rt.subresource)
	writeStatus(w, notFound(nodesResource, rt.name))
}

func (p *Proxy) refuse(w http.ResponseWriter, r *http.Request, rt route, s metav1.Status) {
	p.metrics.requests.WithLabelValues(rt.kind.String(), decisionRefused).Inc()
	p.log.Info("refused request", "method", r.Method, "path", r.URL.Path, "code", s.Code, "message", s.Message)
	writeStatus(w, s)
}

func (p *Proxy) lookupFailed(w http.ResponseWriter, r *http.Request, rt route, err error) {
	p.metrics.requests.WithLabelValues(rt.kind.String(), decisionError).Inc()
	var ue *upstreamError
	if errors.As(err, &ue) {
		// The API server's own answer to the check (401, 403, 429, ...).
		relayUpstreamError(w, ue)
		return
	}
	if errors.Is(err, errAnswerBudget) {
		p.log.Info("refused a request: too many answers in flight", "node", rt.name, "method", r.Method)
		writeStatus(w, tooManyAnswers(w, err))
		return
	}
	if r.Context().Err() == nil {
		p.log.Error(err, "node check failed", "node", rt.name, "method", r.Method)
	}
	writeStatus(w, badGateway(err))
}

func (p *Proxy) upstreamFailed(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, errNodeChanged) {
		return // forwardHeld forwards the GET again, or answers
	}
	if r.Context().Err() != nil {
		return // the client went away (a watch ended): nothing to answer
	}
	p.metrics.requests.WithLabelValues("upstream", decisionError).Inc()
	var ue *upstreamError
	switch {
	case errors.As(err, &ue):
		// The API server's own answer to the gate's read of a Node after a
		// held answer (401, 403, 429, ...), as for its read before.
		relayUpstreamError(w, ue)
	case errors.Is(err, errAnswerBudget):
		p.log.Info("refused a request: too many answers in flight", "method", r.Method, "path", r.URL.Path)
		writeStatus(w, tooManyAnswers(w, err))
	case errors.Is(err, errUndecodedAnswer), errors.Is(err, errAnswerTooLarge):
		p.log.Info("refused the API server's answer", "method", r.Method, "path", r.URL.Path, "reason", err.Error())
		writeStatus(w, refusedAnswer(err))
	default:
		p.log.Error(err, "API server request failed", "method", r.Method, "path", r.URL.Path)
		writeStatus(w, badGateway(err))
	}
}

// relayUpstreamError answers with the API server's own error answer to a
// read of the gate.
func relayUpstreamError(w http.ResponseWriter, ue *upstreamError) {
	if ue.contentType != "" {
		w.Header().Set("Content-Type", ue.contentType)
	}
	w.WriteHeader(ue.code)
	_, _ = w.Write(ue.body)
}

// authenticated reports whether r carries the client token as its bearer
// token (compared in constant time).
func (p *Proxy) authenticated(r *http.Request) bool {
	auth := r.Header.Values("Authorization")
	if len(auth) != 1 {
		return false
	}
	scheme, token, ok := strings.Cut(auth[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(token)), p.cfg.ClientToken) == 1
}

// credentialHeader reports whether a header carries the caller's identity.
func credentialHeader(k string) bool {
	k = http.CanonicalHeaderKey(k)
	return k == "Authorization" || strings.HasPrefix(k, "Impersonate-")
}
