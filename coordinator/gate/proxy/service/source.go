package service

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/wire"
)

// The Service history's source lists and watches all Services with the
// gate's own credentials, read by the same readers as the view's answers
// (reader.go): a Service becomes a HistoryService (its key,
// resourceVersion and the view's facts) without ever being decoded, and
// ccm-gate carries no generated client for the Kubernetes API groups.

// HistoryService is what the history keeps of one Service.
type HistoryService struct {
	metav1.TypeMeta
	// ObjectMeta holds name, namespace, resourceVersion, and on a bookmark
	// the initial-events-end annotation.
	metav1.ObjectMeta
	Facts Facts
}

// DeepCopyObject implements runtime.Object.
func (s *HistoryService) DeepCopyObject() runtime.Object {
	c := *s
	c.ObjectMeta = *s.ObjectMeta.DeepCopy()
	return &c
}

// historyServiceList is one page of Services.
type historyServiceList struct {
	metav1.TypeMeta
	metav1.ListMeta
	Items []HistoryService
}

// DeepCopyObject implements runtime.Object.
func (l *historyServiceList) DeepCopyObject() runtime.Object {
	c := *l
	c.ListMeta = *l.ListMeta.DeepCopy()
	c.Items = append([]HistoryService(nil), l.Items...)
	for i := range c.Items {
		c.Items[i].ObjectMeta = *l.Items[i].ObjectMeta.DeepCopy()
	}
	return &c
}

var (
	_ runtime.Object = (*HistoryService)(nil)
	_ runtime.Object = (*historyServiceList)(nil)
)

func NewHistoryService(f Facts) HistoryService {
	s := HistoryService{
		ObjectMeta: metav1.ObjectMeta{Name: f.Name, Namespace: f.Namespace, ResourceVersion: f.ResourceVersion},
		Facts:      f,
	}
	if f.InitialEventsEnd {
		s.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
	}
	return s
}

// Source lists and watches all Services as protobuf, with the gate's
// own credentials.
type Source struct {
	Base      *url.URL
	Client    *http.Client
	UserAgent string
}

func (s *Source) request(ctx context.Context, o metav1.ListOptions, watching bool) (*http.Response, error) {
	o.Watch = watching
	q, err := metav1.ParameterCodec.EncodeParameters(&o, metav1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	u := *s.Base
	u.Path = strings.TrimSuffix(s.Base.Path, "/") + "/api/v1/services"
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", wire.ContentTypeProtobuf)
	req.Header.Set("User-Agent", s.UserAgent)
	resp, err := s.Client.Do(req)
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
	return apierrors.NewGenericServerResponse(resp.StatusCode, http.MethodGet, schema.GroupResource{Resource: "services"}, "", string(body), 0, false)
}

// List reads one page of Services.
func (s *Source) List(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	resp, err := s.request(ctx, o, false)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	list := &historyServiceList{}
	err = ReadList(wire.MediaProtobuf, resp.Body, "", true, ListVisit{
		Begin: func(uint64) error { return nil },
		Meta: func(m ListMeta) error {
			list.ResourceVersion, list.Continue = m.ResourceVersion, m.ContinueToken
			return nil
		},
		Item: func(svc *Service) error {
			list.Items = append(list.Items, NewHistoryService(svc.Facts))
			return nil
		},
	})
	if err != nil {
		return nil, err
	}
	return list, nil
}

// Watch opens a watch of Services.
func (s *Source) Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	resp, err := s.request(ctx, o, true)
	if err != nil {
		return nil, err
	}
	d := &historyDecoder{body: resp.Body, events: NewEventReader(wire.MediaProtobuf, resp.Body, "")}
	return watch.NewStreamWatcher(d, apierrors.NewClientErrorReporter(http.StatusInternalServerError, http.MethodGet, "ClientWatchDecoding")), nil
}

// historyDecoder reads a watch of Services as watch events of
// historyServices (and the Status of an ERROR).
type historyDecoder struct {
	body   io.Closer
	events EventReader
}

// Decode implements watch.Decoder.
func (d *historyDecoder) Decode() (watch.EventType, runtime.Object, error) {
	ev, err := d.events.Next()
	if err != nil {
		return "", nil, err
	}
	if ev.Status != nil {
		return watch.Error, ev.Status, nil
	}
	s := NewHistoryService(ev.Service.Facts)
	return watch.EventType(ev.Type), &s, nil
}

// Close implements watch.Decoder.
func (d *historyDecoder) Close() { _ = d.body.Close() }
