package profile

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestBuiltinProfilesLoadAndValidate(t *testing.T) {
	s, err := Builtin()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"aws", "azure", "cloudscale", "digital-ocean", "gcp", "hcloud", "openstack", "oracle", "scaleway"}
	for _, name := range want {
		p, ok := s.Get(name)
		if !ok {
			t.Errorf("built-in profile %q missing", name)
			continue
		}
		if !p.Routes(name) {
			t.Errorf("profile %q does not route its own platform name", name)
		}
		if s.File(name) != "profiles/"+name+".yaml" {
			t.Errorf("profile %q comes from %s", name, s.File(name))
		}
	}
	if got := s.Names(); len(got) < len(want) {
		t.Errorf("names = %v", got)
	}
}

const validHcloud = `
apiVersion: hybridccm.io/v1alpha1
kind: Profile
name: hcloud
platforms: [hcloud]
providerIDPrefixes: ["hcloud://"]
ccm:
  image: {repository: r, tag: v1}
  cloudProvider: hcloud
  securePort: 10300
credentials:
  secretName: hcloud
  env: [{name: HCLOUD_TOKEN, key: token}]
chart: {source: builtin}
`

func TestParseErrorsNameFileAndField(t *testing.T) {
	tests := []struct {
		name string
		// doc is the profile YAML.
		doc string
		// want are substrings the error must contain (file, profile, field path).
		want []string
	}{
		{
			name: "unknown field is rejected with its path",
			doc:  validHcloud + "ccm2: {}\n",
			want: []string{"x.yaml", `unknown field "ccm2"`},
		},
		{
			name: "nested unknown field",
			doc:  strings.Replace(validHcloud, "cloudProvider: hcloud", "cloudProvider: hcloud\n  imagePullPolicy: Always", 1),
			want: []string{`profile "hcloud"`, `unknown field "ccm.imagePullPolicy"`},
		},
		{
			name: "missing tag",
			doc:  strings.Replace(validHcloud, "tag: v1", "tag: ''", 1),
			want: []string{"x.yaml", `profile "hcloud"`, "ccm.image.tag: Required value: pin a version: tag (one release for every Kubernetes minor) or tags"},
		},
		{
			name: "enforced flag in args",
			doc:  strings.Replace(validHcloud, "securePort: 10300", "securePort: 10300\n  args: [--controllers=*]", 1),
			want: []string{"ccm.args[0]: Forbidden: --controllers is set by the coordinator"},
		},
		{
			name: "token audience of the API server",
			doc:  strings.Replace(validHcloud, "securePort: 10300", "securePort: 10300\n  tokenAudiences: [sts.amazonaws.com, 'https://kubernetes.default.svc.cluster.local', '', sts.amazonaws.com]", 1),
			want: []string{"ccm.tokenAudiences[1]: Forbidden: https://kubernetes.default.svc.cluster.local is an audience of the API server",
				`ccm.tokenAudiences[2]: Invalid value: ""`, `ccm.tokenAudiences[3]: Duplicate value: "sts.amazonaws.com"`},
		},
		{
			name: "flag without its value in args",
			doc:  strings.Replace(validHcloud, "securePort: 10300", "securePort: 10300\n  args: [--cluster-name]", 1),
			want: []string{`ccm.args[0]: Invalid value: "--cluster-name"`, "write --cluster-name=value"},
		},
		{
			name: "default CCM port",
			doc:  strings.Replace(validHcloud, "10300", "10258", 1),
			want: []string{"ccm.securePort: Invalid value: 10258: reserved for default CCM secure port"},
		},
		{
			name: "repository chart needs a version",
			doc:  strings.Replace(validHcloud, "chart: {source: builtin}", "chart: {source: repository, repository: 'https://charts.example', name: c}", 1),
			want: []string{"chart.version: Required value"},
		},
		{
			name: "no credentials keys",
			doc:  strings.Replace(validHcloud, "  env: [{name: HCLOUD_TOKEN, key: token}]\n", "", 1),
			want: []string{"credentials: Required value"},
		},
		{
			name: "load balancers: the service controller's name",
			doc:  validHcloud + "loadBalancers: {controller: '*'}\n",
			want: []string{`loadBalancers.controller: Invalid value: "*"`},
		},
		{
			name: "load balancers: unsupported with a controller",
			doc:  validHcloud + "loadBalancers: {controller: service, unsupported: no load balancers here}\n",
			want: []string{"loadBalancers.unsupported: Invalid value", "an unsupported CCM has no controller or env"},
		},
		{
			name: "load balancers: cloud-config settings without a cloud-config file",
			doc:  validHcloud + "loadBalancers: {controller: service, cloudConfig: [Global.network]}\n",
			want: []string{"loadBalancers.cloudConfig: Invalid value", "ccm.cloudConfig is not set"},
		},
		{
			name: "load balancers: a cloud-config setting that is not one",
			doc: strings.Replace(validHcloud, "securePort: 10300", "securePort: 10300\n  cloudConfig: {key: cloud.conf, path: /etc/cloud.conf}", 1) +
				"loadBalancers: {controller: service, cloudConfig: ['LoadBalancer.subnet-id', 'subnet id = x', 'LoadBalancer.subnet-id']}\n",
			want: []string{`loadBalancers.cloudConfig[1]: Invalid value: "subnet id = x"`, `loadBalancers.cloudConfig[2]: Duplicate value: "LoadBalancer.subnet-id"`},
		},
		{
			name: "tags per minor keyed other than 1.N, or not a tag",
			doc:  strings.Replace(validHcloud, "tag: v1}", "tags: {'1.36': v1.36.2, '1.x': v1, 'v1.35': v1, '1.034': v1, '1.37': 'v1 latest'}}", 1),
			want: []string{"x.yaml", `profile "hcloud"`, `ccm.image.tags[1.x]: Invalid value: "1.x"`, `ccm.image.tags[v1.35]: Invalid value: "v1.35"`,
				`ccm.image.tags[1.034]: Invalid value: "1.034"`, `ccm.image.tags[1.37]: Invalid value: "v1 latest": not an image tag`},
		},
		{
			name: "node filter: an enforced flag, a flag given in args too, no since",
			doc:  strings.Replace(validHcloud, "securePort: 10300", "securePort: 10300\n  args: [--node-filter-requirements=a=b]\n  nodeFilter: {selectorFlag: --node-filter-requirements}", 1),
			want: []string{`ccm.args[0]: Invalid value: "--node-filter-requirements=a=b": set by ccm.nodeFilter.selectorFlag`, "ccm.nodeFilter.since: Required value"},
		},
		{
			name: "node filter: bad flag, label and since",
			doc:  strings.Replace(validHcloud, "securePort: 10300", "securePort: 10300\n  nodeFilter: {selectorFlag: --controllers, foreignNodeLabels: {'node.cloudprovider.kubernetes.io/platform': x, 'a/b': 'no spaces'}, since: [v1.2.3, latest, v1.2.9]}", 1),
			want: []string{"ccm.nodeFilter.selectorFlag: Forbidden: --controllers is set by the coordinator",
				"ccm.nodeFilter.foreignNodeLabels[node.cloudprovider.kubernetes.io/platform]: Forbidden",
				`ccm.nodeFilter.foreignNodeLabels[a/b]: Invalid value: "no spaces"`,
				`ccm.nodeFilter.since[1]: Invalid value: "latest"`, `ccm.nodeFilter.since[2]: Duplicate value: "release line 1.2"`},
		},
		{
			name: "domain: a cloud-config region without a boundary label or a cloud config",
			doc:  validHcloud + "domain: {cloudConfigRegion: Global.Region}\n",
			want: []string{"domain.boundaryLabel: Required value: cloudConfigRegion configures the boundary label's value"},
		},
		{
			name: "domain: a cloud-config region without a cloud config",
			doc:  validHcloud + "domain: {boundaryLabel: topology.kubernetes.io/region, cloudConfigRegion: Global.Region}\n",
			want: []string{"ccm.cloudConfig: Required value: cloudConfigRegion is a setting of the cloud-config file"},
		},
		{
			name: "domain: a cloud-config region that is no Section.key",
			doc: strings.Replace(validHcloud, "securePort: 10300", "securePort: 10300\n  cloudConfig: {key: cloud.conf, path: /etc/c/cloud.conf}", 1) +
				"domain: {boundaryLabel: topology.kubernetes.io/region, cloudConfigRegion: 'Region = x'}\n",
			want: []string{`domain.cloudConfigRegion: Invalid value: "Region = x": a setting of the cloud-config file as Section.key`},
		},
		{
			name: "wrong kind",
			doc:  strings.Replace(validHcloud, "kind: Profile", "kind: Profil", 1),
			want: []string{`kind: Unsupported value: "Profil"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("x.yaml", []byte(tt.doc))
			if err == nil {
				t.Fatal("expected an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	if _, err := Parse("x.yaml", []byte(validHcloud)); err != nil {
		t.Fatalf("valid profile rejected: %v", err)
	}
}

func TestOverrides(t *testing.T) {
	tests := []struct {
		name string
		// override is the override document.
		override string
		// wantErr is a substring of the expected error, empty for success.
		wantErr string
		// check inspects the merged profile on success.
		check func(t *testing.T, p *Profile)
	}{
		{
			name:     "image tag only; everything else kept",
			override: "name: hcloud\nccm: {image: {tag: v9.9.9}}\n",
			check: func(t *testing.T, p *Profile) {
				if p.CCM.Image.Tag != "v9.9.9" || p.CCM.Image.Repository != "docker.io/hetznercloud/hcloud-cloud-controller-manager" {
					t.Errorf("image = %+v", p.CCM.Image)
				}
				if !slices.Contains(p.CCM.Args, "--allow-untagged-cloud=true") {
					t.Errorf("args lost: %v", p.CCM.Args)
				}
			},
		},
		{
			name:     "lists replace",
			override: "name: hcloud\nccm: {args: [--v=4]}\n",
			check: func(t *testing.T, p *Profile) {
				if !slices.Equal(p.CCM.Args, []string{"--v=4"}) {
					t.Errorf("args = %v", p.CCM.Args)
				}
			},
		},
		{
			name:     "switch to an upstream chart",
			override: "name: hcloud\nchart: {source: repository, repository: 'https://charts.hetzner.cloud', name: hcloud-cloud-controller-manager, version: 1.26.0, values: {replicaCount: 1}}\n",
			check: func(t *testing.T, p *Profile) {
				if p.Chart.Source != ChartRepository || p.Chart.Values["replicaCount"] != int64(1) {
					t.Errorf("chart = %+v", p.Chart)
				}
			},
		},
		{
			name:     "invalid merge names the override file and field",
			override: "name: hcloud\nccm: {securePort: 80}\n",
			wantErr:  `override.yaml: profile "hcloud": ccm.securePort`,
		},
		{
			name:     "port clash with another profile",
			override: "name: hcloud\nccm: {securePort: 10270}\n",
			wantErr:  `ccm.securePort: Duplicate value: "10270 (also used by profile \"aws\")"`,
		},
		{
			name:     "new profile must be complete",
			override: "name: mycloud\nccm: {securePort: 10299}\n",
			wantErr:  `override.yaml: profile "mycloud": apiVersion`,
		},
		{
			name:     "unknown field in override",
			override: "name: hcloud\nccm: {imagee: {}}\n",
			wantErr:  `unknown field "ccm.imagee"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Builtin()
			if err != nil {
				t.Fatal(err)
			}
			err = s.Override("override.yaml", []byte(tt.override))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			p, _ := s.Get("hcloud")
			tt.check(t, p)
			if s.File("hcloud") != "override.yaml" {
				t.Errorf("file = %s", s.File("hcloud"))
			}
		})
	}
}

func TestOverrideDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hcloud.yaml"), []byte("name: hcloud\nccm: {image: {tag: v2}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "..data"), 0o700); err != nil {
		t.Fatal(err)
	}
	s, err := Builtin()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.OverrideDir(dir); err != nil {
		t.Fatal(err)
	}
	p, _ := s.Get("hcloud")
	if p.CCM.Image.Tag != "v2" {
		t.Errorf("tag = %s", p.CCM.Image.Tag)
	}
}
