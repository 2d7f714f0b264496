package proxy

import (
	"encoding/json"
	"fmt"
	"net/url"
	"reflect"
	"slices"

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

// deleteOptionParams are the query parameters the API server reads as
// DeleteOptions — but only when the request has no body. The gate always
// forwards a body (its preconditions), so it must carry these in the body.
var deleteOptionParams = []string{
	"dryRun", "gracePeriodSeconds", "propagationPolicy", "orphanDependents",
	"ignoreStoreReadErrorWithClusterBreakingPotential",
}

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

// requestDeleteOptions returns the DeleteOptions a DELETE means — those of
// its body merged with those of its query, decoded as the API server decodes
// them — and the query without them. An option given in both places with
// different values is an error naming it: the API server would silently have
// used the body's, the client evidently meant something else.
func requestDeleteOptions(query url.Values, body []byte, contentType string) (*metav1.DeleteOptions, url.Values, error) {
	opts, err := decodeDeleteOptions(body, contentType)
	if err != nil {
		return nil, nil, err
	}
	rest := url.Values{}
	given := url.Values{}
	for k, v := range query {
		if slices.Contains(deleteOptionParams, k) {
			given[k] = v
		} else {
			rest[k] = v
		}
	}
	if len(given) == 0 {
		return opts, rest, nil
	}
	fromQuery := &metav1.DeleteOptions{}
	// The API server's own conversion of query parameters to DeleteOptions.
	if err := metav1.Convert_url_Values_To_v1_DeleteOptions(&given, fromQuery, nil); err != nil {
		return nil, nil, fmt.Errorf("delete options in the query: %w", err)
	}
	merge := []struct {
		name        string
		body, query any // pointers to the fields
	}{
		{"dryRun", &opts.DryRun, &fromQuery.DryRun},
		{"gracePeriodSeconds", &opts.GracePeriodSeconds, &fromQuery.GracePeriodSeconds},
		{"propagationPolicy", &opts.PropagationPolicy, &fromQuery.PropagationPolicy},
		{"orphanDependents", &opts.OrphanDependents, &fromQuery.OrphanDependents},
		{"ignoreStoreReadErrorWithClusterBreakingPotential", &opts.IgnoreStoreReadErrorWithClusterBreakingPotential, &fromQuery.IgnoreStoreReadErrorWithClusterBreakingPotential},
	}
	for _, f := range merge {
		b, q := reflect.ValueOf(f.body).Elem(), reflect.ValueOf(f.query).Elem()
		switch {
		case q.IsZero():
		case b.IsZero():
			b.Set(q)
		case !reflect.DeepEqual(b.Interface(), q.Interface()):
			return nil, nil, fmt.Errorf("delete option %s is %s in the query but %s in the body: send it once", f.name, show(q), show(b))
		}
	}
	return opts, rest, nil
}

func show(v reflect.Value) string {
	b, _ := json.Marshal(v.Interface())
	return string(b)
}

func encodeDeleteOptions(opts *metav1.DeleteOptions) ([]byte, error) {
	opts.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "DeleteOptions"}
	return json.Marshal(opts)
}
