package writefloor

import (
	"strings"
	"sync"
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
	post := Kind{Verb: "POST", Resource: "nodes"}
	put := Kind{Verb: "PUT", Resource: "nodes"}
	status := Kind{Verb: "PUT", Resource: "nodes", Subresource: "status"}
	patch := Kind{Verb: "PATCH", Resource: "nodes"}
	lease := Kind{Verb: "PUT", Resource: "leases"}
	f := Floor{
		Writes: Counts{post: 1000, put: 1000, status: 1000, patch: 500, lease: 2},
		Ceilings: []Ceiling{
			// registrations and both updates measured together: 1000 writes/s
			{Stages: []Stage{{Kinds: []Kind{post}, Workers: 32}, {Kinds: []Kind{put, status}, Workers: 32}}, Writes: 3000, Elapsed: 3 * time.Second},
			{Stages: []Stage{{Kinds: []Kind{patch}, Workers: 16}}, Writes: 1000, Elapsed: 4 * time.Second}, // 250/s
		},
		Objects: 1000,
	}
	if got, want := f.Duration(), 5*time.Second; got != want {
		t.Errorf("floor %v, want %v", got, want)
	}
	if got := f.Priced().Total(); got != 3500 {
		t.Errorf("priced %v writes, want 3500", got)
	}
	if got := f.Unpriced(); len(got) != 1 || got[lease] != 2 {
		t.Errorf("unpriced %v, want the 2 lease writes", got)
	}
}

func TestBest(t *testing.T) {
	put := []Stage{{Kinds: []Kind{{Verb: "PUT", Resource: "nodes"}}, Workers: 32}}
	post := []Stage{{Kinds: []Kind{{Verb: "POST", Resource: "nodes"}}, Workers: 32}}
	before := []Ceiling{
		{Stages: post, Writes: 1000, Elapsed: time.Second},
		{Stages: put, Writes: 1000, Elapsed: 4 * time.Second}, // slowed down by other work
	}
	after := []Ceiling{
		{Stages: post, Writes: 1000, Elapsed: 2 * time.Second},
		{Stages: put, Writes: 1000, Elapsed: time.Second},
	}
	got := Best(append(before, after...)...)
	if len(got) != 2 {
		t.Fatalf("got %v, want one ceiling per kind", got)
	}
	for _, c := range got {
		if c.Elapsed != time.Second || c.Rounds != 2 {
			t.Errorf("%s: kept %v of %d rounds, want the 1s one of 2", c.Kinds(), c.Elapsed, c.Rounds)
		}
	}
}

func TestMeasureStages(t *testing.T) {
	const n = 200
	var (
		mu    sync.Mutex
		order = map[int][]string{}
	)
	step := func(name string) func(i int) error {
		return func(i int) error {
			mu.Lock()
			defer mu.Unlock()
			order[i] = append(order[i], name)
			return nil
		}
	}
	k := func(r string) Kind { return Kind{Verb: "POST", Resource: r} }
	c := MeasureStages(t, n,
		Stage{Kinds: []Kind{k("a")}, Workers: 3, Write: step("a")},
		Stage{Kinds: []Kind{k("b"), k("c")}, Workers: 2, Write: step("bc")},
		Stage{Kinds: []Kind{k("d")}, Workers: 1, Write: step("d"), Trailing: true},
	)
	// every object went through every stage once, in order, trailing included
	for i := range n {
		if got := strings.Join(order[i], ","); got != "a,bc,d" {
			t.Errorf("object %d: stages %s, want a,bc,d", i, got)
		}
	}
	// the clock stopped once the stages before the trailing one were done:
	// their writes all count, the trailing stage's up to then
	if c.Writes < 3*n || c.Writes > 4*n {
		t.Errorf("%d writes counted, want 3 per object and up to one more", c.Writes)
	}
}

func TestStageString(t *testing.T) {
	put := Kind{Verb: "PUT", Resource: "nodes"}
	status := Kind{Verb: "PUT", Resource: "nodes", Subresource: "status"}
	event := Kind{Verb: "POST", Resource: "events"}
	for _, tc := range []struct {
		stage Stage
		// want is how reports name the stage.
		want string
	}{
		{Stage{Kinds: []Kind{put, status}, Workers: 32}, "PUT nodes + PUT nodes/status (32 workers)"},
		{Stage{Kinds: []Kind{event, event}, Workers: 2}, "2 POST events (2 workers)"},
	} {
		if got := tc.stage.String(); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
}
