package serviceview

import (
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/wire"
)

func TestNegotiateMedia(t *testing.T) {
	tests := []struct {
		accept string
		want   wire.Media
	}{
		{accept: "", want: wire.MediaJSON},
		{accept: "application/json", want: wire.MediaJSON},
		{accept: "application/vnd.kubernetes.protobuf, */*", want: wire.MediaProtobuf},
		{accept: "application/vnd.kubernetes.protobuf;stream=watch", want: wire.MediaProtobuf},
		{accept: "application/json;as=Table;v=v1;g=meta.k8s.io,application/json", want: wire.MediaJSON},
		{accept: "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"},
		{accept: "application/cbor"},
		{accept: "application/cbor, application/json;q=0.9", want: wire.MediaJSON},
		{accept: "application/json;q=0.5, application/vnd.kubernetes.protobuf", want: wire.MediaProtobuf},
		{accept: "application/json;q=0", want: wire.MediaNone},
		{accept: "*/*", want: wire.MediaJSON},
		{accept: "text/html", want: wire.MediaNone},
		{accept: ";;;,", want: wire.MediaNone},
	}
	for _, tc := range tests {
		got, ok := NegotiateMedia([]string{tc.accept})
		if got != tc.want || ok != (tc.want != wire.MediaNone) {
			t.Errorf("Accept %q: got %v %v, want %v", tc.accept, got, ok, tc.want)
		}
	}
}
