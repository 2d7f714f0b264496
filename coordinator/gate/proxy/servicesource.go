package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/wire"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// The Service history's source lists and watches all Services with the
// gate's own credentials, read by the same readers as the view's answers
// (servicereader.go): a Service becomes a historyService (its key,
// resourceVersion and the view's facts) without ever being decoded, and
// ccm-gate carries no generated client for the Kubernetes API groups.

// historyService is what the history keeps of one Service.
type historyService struct {
	metav1.TypeMeta
	// ObjectMeta holds name, namespace, resourceVersion, and on a bookmark
	// the initial-events-end annotation.
	metav1.ObjectMeta
	facts serviceFacts
}

// DeepCopyObject implements runtime.Object.
func (s *historyService) DeepCopyObject() runtime.Object {
	c := *s
	c.ObjectMeta = *s.ObjectMeta.DeepCopy()
	return &c
}

// historyServiceList is one page of Services.
type historyServiceList struct {
	metav1.TypeMeta
	metav1.ListMeta
	Items []historyService
}

// DeepCopyObject implements runtime.Object.
func (l *historyServiceList) DeepCopyObject() runtime.Object {
	c := *l
	c.ListMeta = *l.ListMeta.DeepCopy()
	c.Items = append([]historyService(nil), l.Items...)
	for i := range c.Items {
		c.Items[i].ObjectMeta = *l.Items[i].ObjectMeta.DeepCopy()
	}
	return &c
}

var (
	_ runtime.Object = (*historyService)(nil)
	_ runtime.Object = (*historyServiceList)(nil)
)

func newHistoryService(f serviceFacts) historyService {
	s := historyService{
		ObjectMeta: metav1.ObjectMeta{Name: f.name, Namespace: f.namespace, ResourceVersion: f.resourceVersion},
		facts:      f,
	}
	if f.initialEventsEnd {
		s.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
	}
	return s
}

// serviceSource lists and watches all Services as protobuf, with the gate's
// own credentials.
type serviceSource struct {
	base      *url.URL
	client    *http.Client
	userAgent string
}

func (s *serviceSource) request(ctx context.Context, o metav1.ListOptions, watching bool) (*http.Response, error) {
	o.Watch = watching
	q, err := metav1.ParameterCodec.EncodeParameters(&o, metav1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	u := *s.base
	u.Path = joinPath(s.base.Path, "/api/v1/services")
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", wire.ContentTypeProtobuf)
	req.Header.Set("User-Agent", s.userAgent)
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer func() { _ = resp.Body.Close() }()
		return nil, statusError(resp)
	}
	if wire.MediaOf(resp.Header.Get("Content-Type")) != wire.MediaProtobuf {
		_ = resp.Body.Close()
		return nil, fmt.Errorf("the API server answered %q to a request for protobuf", resp.Header.Get("Content-Type"))
	}
	return resp, nil
}

// statusError turns an error answer into the API error client-go would have
// returned (the reflector relists on 410 Gone, backs off on 429, ...).
func statusError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var st metav1.Status
	if b := body; len(b) > len(wire.ProtoMagic) && string(b[:len(wire.ProtoMagic)]) == string(wire.ProtoMagic) {
		if o, err := wire.ReadProtoObject(b); err == nil && o.Kind == "Status" && st.Unmarshal(o.Raw) == nil && st.Code != 0 {
			return &apierrors.StatusError{ErrStatus: st}
		}
	}
	return apierrors.NewGenericServerResponse(resp.StatusCode, http.MethodGet, servicesResource, "", string(body), 0, false)
}

// list reads one page of Services.
func (s *serviceSource) list(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	resp, err := s.request(ctx, o, false)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	list := &historyServiceList{}
	err = readList(wire.MediaProtobuf, resp.Body, "", true, listVisit{
		begin: func(uint64) error { return nil },
		meta: func(m listMeta) error {
			list.ResourceVersion, list.Continue = m.resourceVersion, m.continueToken
			return nil
		},
		item: func(svc *service) error {
			list.Items = append(list.Items, newHistoryService(svc.serviceFacts))
			return nil
		},
	})
	if err != nil {
		return nil, err
	}
	return list, nil
}

// watch opens a watch of Services.
func (s *serviceSource) watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	resp, err := s.request(ctx, o, true)
	if err != nil {
		return nil, err
	}
	d := &historyDecoder{body: resp.Body, events: newEventReader(wire.MediaProtobuf, resp.Body, "")}
	return watch.NewStreamWatcher(d, apierrors.NewClientErrorReporter(http.StatusInternalServerError, http.MethodGet, "ClientWatchDecoding")), nil
}

// historyDecoder reads a watch of Services as watch events of
// historyServices (and the Status of an ERROR).
type historyDecoder struct {
	body   io.Closer
	events eventReader
}

// Decode implements watch.Decoder.
func (d *historyDecoder) Decode() (watch.EventType, runtime.Object, error) {
	ev, err := d.events.next()
	if err != nil {
		return "", nil, err
	}
	if ev.status != nil {
		return watch.Error, ev.status, nil
	}
	s := newHistoryService(ev.svc.serviceFacts)
	return watch.EventType(ev.typ), &s, nil
}

// Close implements watch.Decoder.
func (d *historyDecoder) Close() { _ = d.body.Close() }
