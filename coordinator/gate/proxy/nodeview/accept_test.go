package nodeview

import (
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/wire"
)

// TestPlainPreferredAsTheAPIServer: Accept headers that the API server reads
// otherwise than mime.ParseMediaType does. For each, the gate used to decide
// on a plain Node (and ask the API server for exactly that), while the API
// server, asked with the client's header, answers another form (a Table,
// mostly) or another encoding: the client got what it had not asked for
// (TestViewNodeReadFormAsTheAPIServer shows it against the API server). The
// API server (k8s.io/apiserver negotiation) reads the first Accept header
// only; splits clauses and parameters on ',', ';' and '=' without quoting,
// trimming spaces only, and compares type, subtype and parameter names as
// written; parses q as a float32, with an unparsable q read as 0; and sorts
// the clauses with a comparison that puts a clause without wildcards before
// one with them whatever their q-values. Held is always right (the header
// goes to the API server as sent); a plain pick must be the API server's.
func TestPlainPreferredAsTheAPIServer(t *testing.T) {
	const table = "application/json;as=Table;g=meta.k8s.io;v=v1"
	tests := []struct {
		why    string
		accept []string
		want   wire.Media // mediaNone: held
	}{
		{"a Table sorts before a wildcard of higher q", []string{"*/*, " + table + ";q=0.5"}, wire.MediaNone},
		{"a Table sorts before application/* of higher q", []string{"application/*, " + table + ";q=0.5"}, wire.MediaNone},
		{"protobuf sorts before a wildcard of higher q", []string{"*/*;q=1, application/vnd.kubernetes.protobuf;q=0.5"}, wire.MediaProtobuf},
		{"the type is compared as written", []string{"Application/JSON, " + table + ";q=0.5"}, wire.MediaNone},
		{"a parameter name is compared as written", []string{table + ";Q=0.1, application/json;q=0.5"}, wire.MediaNone},
		{"a tab is not trimmed", []string{table + ";q=0.5,\tapplication/json"}, wire.MediaNone},
		{"only the first Accept header is read", []string{table + ";q=0.5", "application/json"}, wire.MediaNone},
		{"q is a float32", []string{table + ";q=0.5, application/json;q=0.50000001"}, wire.MediaNone},
		{"q=NaN", []string{table + ";q=NaN, application/json;q=0.5"}, wire.MediaNone},
		{"a space in q makes it 0", []string{"application/json;q= 0.9, " + table + ";q=0.5"}, wire.MediaNone},
		{"a quoted q is 0", []string{`application/json;q="0.9", ` + table + ";q=0.5"}, wire.MediaNone},
		{"an unknown stream skips the clause", []string{"application/json;stream=x, " + table + ";q=0.5"}, wire.MediaNone},
		{"pretty=1 indents the answer", []string{"application/json;pretty=1"}, wire.MediaNone},
		{"application/* alone is a 406 of the API server's router", []string{"application/*"}, wire.MediaNone},
		{"so is application/json with a space inside", []string{"application/ json"}, wire.MediaNone},
		// still plain: what the API server answers as a plain Node
		{"client-go's protobuf header", []string{"application/vnd.kubernetes.protobuf, */*"}, wire.MediaProtobuf},
		{"client-go's JSON header", []string{"application/json, */*"}, wire.MediaJSON},
		{"an unknown parameter", []string{"application/json;charset=utf-8, " + table + ";q=0.5"}, wire.MediaJSON},
		{"q=1.000 over q=0.0001", []string{"application/json;q=1.000, " + table + ";q=0.0001"}, wire.MediaJSON},
		{"spaces around a parameter", []string{"application/json ; q=1, " + table + ";q=0.5"}, wire.MediaJSON},
		{"no Accept header", nil, wire.MediaJSON},
	}
	for _, tc := range tests {
		got, ok := plainPreferred(tc.accept)
		if got != tc.want || ok != (tc.want != wire.MediaNone) {
			t.Errorf("%s: Accept %q: got %v %v, want %v", tc.why, tc.accept, got, ok, tc.want)
		}
	}
}

// FuzzPlainPreferred: no Accept header makes plainPreferred panic.
func FuzzPlainPreferred(f *testing.F) {
	f.Add("application/json;as=Table;g=meta.k8s.io;v=v1;q=0.5, */*")
	f.Add("application/vnd.kubernetes.protobuf, */*")
	f.Add("*/*;q=NaN,\tapplication/json;q=\"1\";;=,")
	f.Fuzz(func(t *testing.T, accept string) {
		plainPreferred([]string{accept})
		plainPreferred([]string{accept, accept})
	})
}

// TestPlainPreferred: a GET of a Node is checked by its answer only when the
// API server would answer it as a plain Node anyway; any header with which it
// might answer in another form is held (package proxy, nodehold.go) and forwarded as sent.
func TestPlainPreferred(t *testing.T) {
	tests := []struct {
		accept string
		want   wire.Media // mediaNone: held
	}{
		{accept: "", want: wire.MediaJSON},
		{accept: "application/json", want: wire.MediaJSON},
		{accept: "application/vnd.kubernetes.protobuf,application/json", want: wire.MediaProtobuf},
		{accept: "application/vnd.kubernetes.protobuf, */*", want: wire.MediaProtobuf},
		{accept: "*/*", want: wire.MediaJSON},
		{accept: "application/json, application/yaml;q=0.5", want: wire.MediaJSON},
		{accept: "application/json;q=0.9, application/json;as=Table;v=v1;g=meta.k8s.io;q=0.8", want: wire.MediaJSON},
		{accept: "application/json, application/cbor;q=0", want: wire.MediaJSON},
		// kubectl get node, client-go's metadata client
		{accept: "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"},
		{accept: "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"},
		{accept: "application/yaml"},
		{accept: "application/cbor"},
		{accept: "application/json;as=Table;v=v1;g=meta.k8s.io"},
		// a tie: the API server's order is not the header's
		{accept: "application/json, application/yaml"},
		// wildcards go last at the API server
		{accept: "*/*, application/yaml"},
		{accept: "application/json;q=0.5, application/yaml;q=0.5"},
		// what the gate cannot read, the API server reads its own way
		{accept: "application/json, application/yaml;q=2"},
		{accept: "application/json, application/yaml;q=x"},
		{accept: "application/json, ;;;"},
		// nothing plain: the API server decides (406, or another form)
		{accept: "application/json;q=0"},
		{accept: "text/html"},
	}
	for _, tc := range tests {
		got, ok := plainPreferred([]string{tc.accept})
		if got != tc.want || ok != (tc.want != wire.MediaNone) {
			t.Errorf("Accept %q: got %v %v, want %v", tc.accept, got, ok, tc.want)
		}
	}
}
