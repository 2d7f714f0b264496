package proxy

import (
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
)

// maxDeleteBody bounds a DELETE request body (DeleteOptions are tiny).
const maxDeleteBody = 64 << 10

// optionsDecoder reads DeleteOptions as clients send them: JSON, YAML or
// protobuf (client-go sends protobuf when the CCM runs with the default
// --kube-api-content-type), with apiVersion v1 or meta.k8s.io/v1.
var optionsDecoder = func() runtime.Decoder {
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	s.AddKnownTypes(metav1.SchemeGroupVersion, &metav1.DeleteOptions{})
	return serializer.NewCodecFactory(s).UniversalDeserializer()
}()

var deleteOptionsKind = schema.GroupVersionKind{Version: "v1", Kind: "DeleteOptions"}

func decodeDeleteOptions(body []byte, contentType string) (*metav1.DeleteOptions, error) {
	opts := &metav1.DeleteOptions{}
	if len(body) == 0 {
		return opts, nil
	}
	if _, _, err := optionsDecoder.Decode(body, &deleteOptionsKind, opts); err != nil {
		return nil, fmt.Errorf("decode delete options (%s): %w", contentType, err)
	}
	return opts, nil
}

func encodeDeleteOptions(opts *metav1.DeleteOptions) ([]byte, error) {
	opts.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "DeleteOptions"}
	return json.Marshal(opts)
}
