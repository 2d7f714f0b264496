package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"google.golang.org/protobuf/encoding/protowire"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// The Service history lists and watches Services with the same wire-level
// reading as the view: a Service becomes a historyService (its key,
// resourceVersion and the view's facts) without ever being decoded, and ccm-gate
// carries no generated client for the Kubernetes API groups.

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

func newHistoryService(f serviceFacts, initialEventsEnd bool) historyService {
	s := historyService{
		ObjectMeta: metav1.ObjectMeta{Name: f.name, Namespace: f.namespace, ResourceVersion: f.resourceVersion},
		facts:      f,
	}
	if initialEventsEnd {
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

// Field numbers of ListMeta.
const (
	pbListMetaResourceVersion protowire.Number = 2
	pbListMetaContinue        protowire.Number = 3
)

func (s *serviceSource) request(ctx context.Context, o metav1.ListOptions, watching bool) (*http.Response, error) {
	q := url.Values{}
	set := func(k, v string) {
		if v != "" {
			q.Set(k, v)
		}
	}
	set("resourceVersion", o.ResourceVersion)
	set("resourceVersionMatch", string(o.ResourceVersionMatch))
	set("labelSelector", o.LabelSelector)
	set("fieldSelector", o.FieldSelector)
	set("continue", o.Continue)
	if o.Limit > 0 {
		q.Set("limit", strconv.FormatInt(o.Limit, 10))
	}
	if o.TimeoutSeconds != nil {
		q.Set("timeoutSeconds", strconv.FormatInt(*o.TimeoutSeconds, 10))
	}
	if watching {
		q.Set("watch", "true")
		if o.AllowWatchBookmarks {
			q.Set("allowWatchBookmarks", "true")
		}
		if o.SendInitialEvents != nil {
			q.Set("sendInitialEvents", strconv.FormatBool(*o.SendInitialEvents))
		}
	}
	u := *s.base
	u.Path = joinPath(s.base.Path, "/api/v1/services")
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", contentTypeProtobuf)
	req.Header.Set("User-Agent", s.userAgent)
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer func() { _ = resp.Body.Close() }()
		return nil, statusError(resp)
	}
	if mediaOf(resp.Header.Get("Content-Type")) != mediaProtobuf {
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
	if b := body; len(b) > len(protoMagic) && string(b[:len(protoMagic)]) == string(protoMagic) {
		if o, err := readProtoObject(b); err == nil && o.kind == "Status" && st.Unmarshal(o.raw) == nil && st.Code != 0 {
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
	ps := newProtoStream(resp.Body, maxServiceValue)
	if err := ps.magic(); err != nil {
		return nil, err
	}
	list := &historyServiceList{}
	sc := protoServiceScan{meta: true}
	for {
		num, typ, length, _, err := ps.header()
		if errors.Is(err, io.EOF) {
			return list, nil
		}
		if err != nil {
			return nil, err
		}
		if typ != protowire.BytesType {
			if _, err := ps.skip(typ); err != nil {
				return nil, err
			}
			continue
		}
		if num != pbUnknownRaw {
			if _, err := ps.bytes(length); err != nil {
				return nil, err
			}
			continue
		}
		for read := uint64(0); read < length; {
			num, typ, l, n, err := ps.header()
			if err != nil {
				return nil, noEOF(err)
			}
			if typ != protowire.BytesType {
				return nil, fmt.Errorf("%w: ServiceList field %d of wire type %d", errProto, num, typ)
			}
			v, err := ps.bytes(l)
			if err != nil {
				return nil, err
			}
			read += uint64(n) + l
			switch num {
			case pbListItems:
				if err := sc.scan(v); err != nil {
					return nil, err
				}
				list.Items = append(list.Items, newHistoryService(sc.facts, false))
			case pbListMeta:
				if err := protoFields(v, func(f protoField) error {
					switch {
					case f.typ != protowire.BytesType:
					case f.num == pbListMetaResourceVersion:
						list.ResourceVersion = string(f.value)
					case f.num == pbListMetaContinue:
						list.Continue = string(f.value)
					}
					return nil
				}); err != nil {
					return nil, err
				}
			}
		}
	}
}

// watch opens a watch of Services.
func (s *serviceSource) watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	resp, err := s.request(ctx, o, true)
	if err != nil {
		return nil, err
	}
	d := &historyDecoder{body: resp.Body, stream: newProtoStream(resp.Body, maxServiceValue), scan: protoServiceScan{meta: true}}
	return watch.NewStreamWatcher(d, apierrors.NewClientErrorReporter(http.StatusInternalServerError, http.MethodGet, "ClientWatchDecoding")), nil
}

// historyDecoder reads a protobuf watch of Services as watch events of
// historyServices (and the Status of an ERROR).
type historyDecoder struct {
	body   io.Closer
	stream *protoStream
	scan   protoServiceScan
}

// Decode implements watch.Decoder.
func (d *historyDecoder) Decode() (watch.EventType, runtime.Object, error) {
	frame, err := d.stream.frame()
	if err != nil {
		return "", nil, err
	}
	typ, object, err := protoWatchEvent(frame)
	if err != nil {
		return "", nil, err
	}
	o, err := readProtoObject(object)
	if err != nil {
		return "", nil, err
	}
	if watch.EventType(typ) == watch.Error {
		st := &metav1.Status{}
		if err := st.Unmarshal(o.raw); err != nil {
			return "", nil, err
		}
		return watch.Error, st, nil
	}
	if err := d.scan.scan(o.raw); err != nil {
		return "", nil, err
	}
	s := newHistoryService(d.scan.facts, d.scan.initialEventsEnd)
	return watch.EventType(typ), &s, nil
}

// Close implements watch.Decoder.
func (d *historyDecoder) Close() { _ = d.body.Close() }
