package proxy

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/types"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		// raw is the request URI as a client sends it.
		raw string
		// want is the route; ignored when wantErr.
		want route
		// wantErr: the gate must refuse the path (400).
		wantErr bool
	}{
		{raw: "/api/v1/nodes", want: route{kind: routeNodes}},
		{raw: "/api/v1/nodes?watch=true&labelSelector=a%3Db", want: route{kind: routeNodes}},
		{raw: "/api/v1/nodes/web-1", want: route{kind: routeNode, name: "web-1"}},
		{raw: "/api/v1/nodes/web-1/status", want: route{kind: routeNode, name: "web-1", subresource: "status"}},
		{raw: "/api/v1/nodes/web-1/proxy/metrics/cadvisor", want: route{kind: routeNode, name: "web-1", subresource: "proxy/metrics/cadvisor"}},
		{raw: "/api/v1/watch/nodes", want: route{kind: routeWatchNodes}},
		{raw: "/api/v1/watch/nodes/web-1", want: route{kind: routeWatchNodes, name: "web-1"}},
		{raw: "/api/v1/watch/nodes/web-1/status", wantErr: true},
		{raw: "/api/v1/proxy/nodes/web-1/pods", want: route{kind: routeLegacyProxy}},
		{raw: "/api/v1/namespaces/kube-system/leases/x", want: route{kind: routeOther}},
		{raw: "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x", want: route{kind: routeOther}},
		{raw: "/api/v1", want: route{kind: routeOther}},
		{raw: "/api", want: route{kind: routeOther}},
		{raw: "/", want: route{kind: routeOther}},
		{raw: "/healthz", want: route{kind: routeOther}},
		{raw: "/openapi/v3/", want: route{kind: routeOther}},
		{raw: "/api/v1/services", want: route{kind: routeServices}},
		{raw: "/api/v1/services?watch=1", want: route{kind: routeServices}},
		{raw: "/api/v1/namespaces/web/services", want: route{kind: routeServices, namespace: "web"}},
		{raw: "/api/v1/namespaces/web/services/front", want: route{kind: routeService, namespace: "web", name: "front"}},
		{raw: "/api/v1/namespaces/web/services/front/status", want: route{kind: routeService, namespace: "web", name: "front", subresource: "status"}},
		{raw: "/api/v1/namespaces/web/services/front:80/proxy/x", want: route{kind: routeService, namespace: "web", name: "front:80", subresource: "proxy/x"}},
		{raw: "/api/v1/watch/services", want: route{kind: routeWatchServices}},
		{raw: "/api/v1/watch/namespaces/web/services", want: route{kind: routeWatchServices, namespace: "web"}},
		{raw: "/api/v1/watch/namespaces/web/services/front", want: route{kind: routeWatchServices, namespace: "web", name: "front"}},
		{raw: "/api/v1/watch/namespaces/web/services/front/status", wantErr: true},
		{raw: "/api/v1/watch/services/front", wantErr: true},
		{raw: "/api/v1/namespaces/web/endpoints/front", want: route{kind: routeOther}},
		{raw: "/api/v1/namespaces/web/configmaps/", want: route{kind: routeOther}},
		{raw: "/api/v1/namespaces//services", wantErr: true},
		{raw: "/api/v1/namespaces/web/services/", wantErr: true},
		{raw: "/api/v1/namespaces/web/services/front/../aws", wantErr: true},
		{raw: "/api/v1/namespaces/web/services/aws%2Fstatus", wantErr: true},
		// Paths the API server could read differently from the gate.
		{raw: "/api/v1/nodes/aws-1%2Fstatus", wantErr: true},
		{raw: "/api/v1/nodes/web-1/../aws-1", wantErr: true},
		{raw: "/api/v1/namespaces/../nodes/aws-1", wantErr: true},
		{raw: "/api//v1/nodes/aws-1", wantErr: true},
		{raw: "/api/v1//nodes", wantErr: true},
		{raw: "/api/v1/nodes/", wantErr: true},
		{raw: "/api/v1/nodes/aws-1/", wantErr: true},
		{raw: "/api/v1/watch//nodes", wantErr: true},
		{raw: "/api/v1/./nodes", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.raw, func(t *testing.T) {
			u, err := url.ParseRequestURI(tc.raw)
			if err != nil {
				t.Fatal(err)
			}
			got, err := classify(u)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("classify = %+v, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("classify = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestDecodeDeleteOptions(t *testing.T) {
	uid := types.UID("u-1")
	grace := int64(5)
	in := &metav1.DeleteOptions{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "DeleteOptions"}, GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &uid}}
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, metav1.SchemeGroupVersion)
	pb, err := runtime.Encode(protobuf.NewSerializer(s, s), in)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, contentType string
		body              []byte
		// wantUID is the precondition read back; empty: none.
		wantUID string
	}{
		{name: "empty body", body: nil},
		{name: "json", contentType: "application/json", body: []byte(`{"kind":"DeleteOptions","apiVersion":"v1","preconditions":{"uid":"u-1"}}`), wantUID: "u-1"},
		{name: "json without kind", contentType: "application/json", body: []byte(`{"preconditions":{"uid":"u-1"}}`), wantUID: "u-1"},
		{name: "json meta.k8s.io", contentType: "application/json", body: []byte(`{"kind":"DeleteOptions","apiVersion":"meta.k8s.io/v1","preconditions":{"uid":"u-1"}}`), wantUID: "u-1"},
		{name: "protobuf", contentType: "application/vnd.kubernetes.protobuf", body: pb, wantUID: "u-1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeDeleteOptions(tc.body, tc.contentType)
			if err != nil {
				t.Fatal(err)
			}
			var uid string
			if got.Preconditions != nil && got.Preconditions.UID != nil {
				uid = string(*got.Preconditions.UID)
			}
			if uid != tc.wantUID {
				t.Fatalf("uid precondition %q, want %q", uid, tc.wantUID)
			}
		})
	}
}

func TestRequestDeleteOptions(t *testing.T) {
	tests := []struct {
		name string
		// query and body of the DELETE.
		query string
		body  string
		// want is the merged options as JSON (without kind); wantQuery what is
		// left of the query; wantErr a substring of the error.
		want, wantQuery, wantErr string
	}{
		{name: "nothing", want: `{}`},
		{name: "query only", query: "dryRun=All&gracePeriodSeconds=0&propagationPolicy=Orphan&pretty=true",
			want: `{"gracePeriodSeconds":0,"propagationPolicy":"Orphan","dryRun":["All"]}`, wantQuery: "pretty=true"},
		{name: "body only", body: `{"dryRun":["All"]}`, want: `{"dryRun":["All"]}`},
		{name: "query fills what the body leaves out", query: "dryRun=All", body: `{"gracePeriodSeconds":3}`,
			want: `{"gracePeriodSeconds":3,"dryRun":["All"]}`},
		{name: "same value twice", query: "gracePeriodSeconds=3", body: `{"gracePeriodSeconds":3}`, want: `{"gracePeriodSeconds":3}`},
		{name: "orphanDependents from the query", query: "orphanDependents=true", want: `{"orphanDependents":true}`},
		{name: "conflict is named", query: "gracePeriodSeconds=0", body: `{"gracePeriodSeconds":30}`, wantErr: "gracePeriodSeconds is 0 in the query but 30 in the body"},
		{name: "dryRun conflict", query: "dryRun=All", body: `{"dryRun":["Bogus"]}`, wantErr: "dryRun"},
		{name: "unparsable grace period", query: "gracePeriodSeconds=soon", wantErr: "query"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q, err := url.ParseQuery(tc.query)
			if err != nil {
				t.Fatal(err)
			}
			opts, rest, err := requestDeleteOptions(q, []byte(tc.body), "application/json")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			opts.TypeMeta = metav1.TypeMeta{}
			got, _ := json.Marshal(opts)
			if string(got) != tc.want {
				t.Errorf("options %s, want %s", got, tc.want)
			}
			if rest.Encode() != tc.wantQuery {
				t.Errorf("query %q, want %q", rest.Encode(), tc.wantQuery)
			}
		})
	}
}
