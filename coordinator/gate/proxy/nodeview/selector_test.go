package nodeview

import (
	"net/url"
	"testing"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

func TestViewSelector(t *testing.T) {
	req, err := platformRequirement(names.PlatformLabel, "hcloud")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		// query is the client's raw query.
		query string
		// want is the labelSelector forwarded; ignored when wantErr.
		want string
		// wantErr: refused with 400.
		wantErr bool
	}{
		{query: "", want: names.PlatformLabel + "=hcloud"},
		{query: "labelSelector=", want: names.PlatformLabel + "=hcloud"},
		{query: "labelSelector=zone%3Da", want: names.PlatformLabel + "=hcloud,zone=a"},
		{query: "labelSelector=" + url.QueryEscape(names.PlatformLabel+"=aws"), want: names.PlatformLabel + "=aws," + names.PlatformLabel + "=hcloud"},
		{query: "labelSelector=" + url.QueryEscape("x in (a,b),!y"), want: names.PlatformLabel + "=hcloud,x in (a,b),!y"},
		// A selector that, pasted as text, would swallow the platform requirement.
		{query: "labelSelector=" + url.QueryEscape("x in (a"), wantErr: true},
		{query: "labelSelector=a&labelSelector=b", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.query, func(t *testing.T) {
			q, _ := url.ParseQuery(tc.query)
			raw, err := ViewSelector(q, labels.Requirements{req})
			if tc.wantErr {
				if err == nil {
					t.Fatalf("viewSelector = %q, want an error", raw)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			out, _ := url.ParseQuery(raw)
			if got := out.Get("labelSelector"); got != tc.want {
				t.Fatalf("labelSelector = %q, want %q", got, tc.want)
			}
		})
	}
}
