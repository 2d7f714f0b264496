package writefloor

import (
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name string
		// text is a Prometheus text exposition.
		text string
		// want are the writes read from it.
		want Counts
	}{
		{
			name: "writes summed over codes and versions, reads and other metrics ignored",
			text: `# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="status",verb="PUT",version="v1"} 7
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="status",verb="PUT",version="v1"} 2
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="",verb="POST",version="v1"} 1000
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="certificates.k8s.io",resource="certificatesigningrequests",scope="resource",subresource="approval",verb="PUT",version="v1"} 1e+03
apiserver_request_duration_seconds_count{component="apiserver",resource="nodes",verb="POST"} 5
`,
			want: Counts{
				{Verb: "PUT", Resource: "nodes", Subresource: "status"}:                        9,
				{Verb: "POST", Resource: "nodes"}:                                              1000,
				{Verb: "PUT", Resource: "certificatesigningrequests", Subresource: "approval"}: 1000,
			},
		},
		{name: "no samples", text: "# nothing\n", want: Counts{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parse(tc.text)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s: got %v, want %v", k, got[k], v)
				}
			}
		})
	}
}

func TestFloor(t *testing.T) {
	put := Kind{Verb: "PUT", Resource: "nodes"}
	status := Kind{Verb: "PUT", Resource: "nodes", Subresource: "status"}
	lease := Kind{Verb: "PUT", Resource: "leases"}
	f := Floor{
		Writes: Counts{put: 1000, status: 1000, lease: 2},
		Ceilings: []Ceiling{
			{Kind: put, Workers: 32, Writes: 1000, Elapsed: 2 * time.Second}, // 500/s
			{Kind: status, Workers: 32, Writes: 1000, Elapsed: time.Second},  // 1000/s
		},
		Objects: 1000,
	}
	if got, want := f.Duration(), 3*time.Second; got != want {
		t.Errorf("floor %v, want %v", got, want)
	}
	if got := f.Priced().Total(); got != 2000 {
		t.Errorf("priced %v writes, want 2000", got)
	}
	if got := f.Unpriced(); len(got) != 1 || got[lease] != 2 {
		t.Errorf("unpriced %v, want the 2 lease writes", got)
	}
}

func TestBest(t *testing.T) {
	put := Kind{Verb: "PUT", Resource: "nodes"}
	post := Kind{Verb: "POST", Resource: "nodes"}
	before := []Ceiling{
		{Kind: post, Workers: 32, Writes: 1000, Elapsed: time.Second},
		{Kind: put, Workers: 32, Writes: 1000, Elapsed: 4 * time.Second}, // slowed down by other work
	}
	after := []Ceiling{
		{Kind: post, Workers: 32, Writes: 1000, Elapsed: 2 * time.Second},
		{Kind: put, Workers: 32, Writes: 1000, Elapsed: time.Second},
	}
	got := Best(before, after)
	if len(got) != 2 {
		t.Fatalf("got %v, want one ceiling per kind", got)
	}
	for _, c := range got {
		if c.Elapsed != time.Second || c.Rounds != 2 {
			t.Errorf("%s: kept %v of %d rounds, want the 1s one of 2", c.Kind, c.Elapsed, c.Rounds)
		}
	}
}
