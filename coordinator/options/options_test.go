package options

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/controller"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/domain"
)

const testGateImage = "ghcr.io/hybrid-ccm/ccm-gate:test"

// parsed returns options bound to a new flag set and parsed from args, as the
// command does.
func parsed(t *testing.T, args ...string) (*Options, *pflag.FlagSet) {
	t.Helper()
	o := New(testGateImage)
	fs := pflag.NewFlagSet("ccm-coordinator", pflag.ContinueOnError)
	o.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	return o, fs
}

// TestDefaults: the defaults are valid, and what the code reads is what the
// flags say (a few that matter most: the chart passes them all explicitly).
func TestDefaults(t *testing.T) {
	o, _ := parsed(t)
	if err := o.Validate(); err != nil {
		t.Fatalf("the defaults do not validate: %v", err)
	}
	if o.ReleaseNamespace != "hybrid-ccm-system" || o.Interval != 10*time.Minute || o.WaitInterval != 30*time.Second ||
		o.UninstallGracePeriod != 10*time.Minute || !o.HelmWait || o.HelmTimeout != 5*time.Minute || o.Concurrent != 4 ||
		o.GateImage != testGateImage || o.NetworkPolicy || o.LeaderElection.Enable || o.Log.LogLevel != "info" ||
		o.Health.LeaseDuration != 15*time.Second || o.Health.CrashLoopRestarts != 3 {
		t.Errorf("defaults: %+v", o)
	}
}

// TestDocumentedFlags: docs/coordinator.md, "Flags", names every flag the
// options register, and each default its table gives is the flag's.
func TestDocumentedFlags(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "coordinator.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Flags\n")
	if !ok {
		t.Fatal(`docs/coordinator.md has no "## Flags" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	_, fs := parsed(t)

	flagRE, codeRE := regexp.MustCompile("`--([a-z0-9-]+)`"), regexp.MustCompile("`([^`]*)`")
	documented := map[string]bool{}
	for _, m := range flagRE.FindAllStringSubmatch(section, -1) {
		documented[m[1]] = true
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if !documented[f.Name] {
			t.Errorf("--%s is not in docs/coordinator.md, Flags", f.Name)
		}
	})

	rows := 0
	for line := range strings.SplitSeq(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`--") {
			continue
		}
		rows++
		names := flagRE.FindAllStringSubmatch(cells[1], -1)
		defaults := codeRE.FindAllStringSubmatch(cells[2], -1)
		if len(defaults) == 0 {
			continue // no default, or one said in words
		}
		if len(defaults) != len(names) {
			t.Errorf("docs row %q: %d flags, %d defaults", line, len(names), len(defaults))
			continue
		}
		for i, n := range names {
			f := fs.Lookup(n[1])
			if f == nil {
				t.Errorf("docs/coordinator.md documents --%s, which the coordinator does not have", n[1])
				continue
			}
			if doc := defaults[i][1]; !sameDefault(t, f, doc) {
				t.Errorf("--%s: documented default %q, the flag's is %q", f.Name, doc, f.DefValue)
			}
		}
	}
	if rows < 20 {
		t.Errorf("read %d rows of the flag table in docs/coordinator.md: the table's form changed", rows)
	}
}

// sameDefault compares a documented default with the flag's, written as the
// docs write it: durations as durations, lists without brackets.
func sameDefault(t *testing.T, f *pflag.Flag, doc string) bool {
	switch f.Value.Type() {
	case "duration":
		d, err := time.ParseDuration(doc)
		if err != nil {
			t.Errorf("--%s: documented default %q is not a duration", f.Name, doc)
		}
		return err == nil && d.String() == f.DefValue
	case "stringSlice", "int32Slice":
		return "["+doc+"]" == f.DefValue
	}
	return doc == f.DefValue
}

// TestValidate: every bad value is reported, all at once, each error naming
// the flag (registered on the flag set) and the value.
func TestValidate(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a.yaml")
	if err := os.WriteFile(file, []byte("name: a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	netpol := "--native-ccm-network-policy"
	for _, tc := range []struct {
		name string
		args []string
		set  func(*Options) // what the flags cannot say
		want []string       // the fields of the errors, in order
	}{
		{name: "valid", args: []string{"--metrics-addr=127.0.0.1:8080", "--health-addr=[::1]:9440", "--pprof-addr=localhost:6060",
			"--events-addr=http://notification-controller.flux-system.svc.cluster.local./", "--profile-overrides=" + dir,
			"--uninstall-grace-period=0s", "--interval=1s", "--gate-image-pull-policy=Never", "--image-pull-secrets=a,b.c",
			"--domain-labels=example.com/zone,zone", netpol, "--native-ccm-api-server-cidrs=10.0.0.0/8,fd00::/8",
			"--native-ccm-api-server-ports=6443,443", "--enable-leader-election", "--log-level=trace", "--log-encoding=console"}},
		{name: "listeners off", args: []string{"--metrics-addr=0", "--health-addr=0", "--pprof-addr=", "--health-addr=:0"}},
		{name: "port by name", args: []string{"--metrics-addr=:http"}},
		{name: "addresses", args: []string{"--metrics-addr=8080", "--health-addr=:99999", "--pprof-addr=bad_host!:6060", "--events-addr=notification-controller:80"},
			want: []string{"--metrics-addr", "--health-addr", "--pprof-addr", "--events-addr"}},
		{name: "retry delays crossed", args: []string{"--min-retry-delay=2m", "--max-retry-delay=1m"}, want: []string{"--min-retry-delay"}},
		{name: "events without host", args: []string{"--events-addr=http:///x"}, want: []string{"--events-addr"}},
		{name: "empty namespace", args: []string{"--release-namespace="}, want: []string{"--release-namespace"}},
		{name: "bad namespace", args: []string{"--release-namespace=Hybrid.CCM"}, want: []string{"--release-namespace"}},
		{name: "overrides missing", args: []string{"--profile-overrides=" + filepath.Join(dir, "none")}, want: []string{"--profile-overrides"}},
		{name: "overrides a file", args: []string{"--profile-overrides=" + file}, want: []string{"--profile-overrides"}},
		{name: "negative durations", args: []string{"--uninstall-grace-period=-1s", "--interval=-1m", "--wait-interval=-1s",
			"--helm-timeout=-5m", "--ccm-lease-duration=-15s", "--min-retry-delay=-1ms", "--max-retry-delay=-1h"},
			want: []string{"--uninstall-grace-period", "--interval", "--wait-interval", "--helm-timeout", "--ccm-lease-duration",
				"--min-retry-delay", "--max-retry-delay"}},
		{name: "counts", args: []string{"--concurrent=0", "--ccm-crash-loop-restarts=-1"}, want: []string{"--concurrent", "--ccm-crash-loop-restarts"}},
		{name: "no gate image", args: []string{"--gate-image= "}, want: []string{"--gate-image"}},
		{name: "pull policy", args: []string{"--gate-image-pull-policy=always"}, want: []string{"--gate-image-pull-policy"}},
		{name: "pull secrets", args: []string{"--image-pull-secrets=Reg_Cred,x,x"}, want: []string{"--image-pull-secrets[0]", "--image-pull-secrets[2]"}},
		{name: "domain labels", args: []string{"--domain-labels=ok.example.com/zone,/zone,a b"}, want: []string{"--domain-labels[1]", "--domain-labels[2]"}},
		{name: "destinations unchecked while off", args: []string{"--native-ccm-api-server-cidrs=10.0.0.1/8", "--native-ccm-cloud-api-ports=0"}},
		{name: "destinations", args: []string{netpol, "--native-ccm-api-server-cidrs=10.0.0.1/8,api.example.com,10.0.0.0/8",
			"--native-ccm-api-server-ports=0,65536", "--native-ccm-cloud-api-cidrs="},
			set: func(o *Options) { o.CloudAPIPorts = nil },
			want: []string{"--native-ccm-api-server-cidrs[0]", "--native-ccm-api-server-cidrs[1]", "--native-ccm-api-server-ports[0]",
				"--native-ccm-api-server-ports[1]", "--native-ccm-cloud-api-cidrs", "--native-ccm-cloud-api-ports"}},
		{name: "log", args: []string{"--log-level=warn", "--log-encoding=text"}, want: []string{"--log-level", "--log-encoding"}},
		{name: "leader election off: timings unchecked", args: []string{"--leader-election-lease-duration=1s"}},
		{name: "lease not above renew deadline", args: []string{"--enable-leader-election", "--leader-election-lease-duration=30s"},
			want: []string{"--leader-election-lease-duration"}},
		{name: "renew deadline not above retries", args: []string{"--enable-leader-election", "--leader-election-renew-deadline=6s"},
			want: []string{"--leader-election-renew-deadline"}},
		{name: "no retry period", args: []string{"--enable-leader-election", "--leader-election-retry-period=0s"},
			want: []string{"--leader-election-retry-period"}},
		{name: "all at once", args: []string{"--interval=-1s", "--concurrent=-1", "--gate-image=", "--log-level=", netpol, "--native-ccm-cloud-api-ports=0"},
			want: []string{"--interval", "--concurrent", "--gate-image", "--native-ccm-cloud-api-ports[0]", "--log-level"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, fs := parsed(t, tc.args...)
			if tc.set != nil {
				tc.set(o)
			}
			err := o.Validate()
			var agg utilerrors.Aggregate
			if err != nil && !errors.As(err, &agg) {
				t.Fatalf("%v is not an aggregate", err)
			}
			var got []string
			if agg != nil {
				for _, e := range agg.Errors() {
					var fe *field.Error
					if !errors.As(e, &fe) {
						t.Errorf("%v is not a field error", e)
						continue
					}
					got = append(got, fe.Field)
					name, _, _ := strings.Cut(strings.TrimPrefix(fe.Field, "--"), "[")
					f := fs.Lookup(name)
					if f == nil {
						t.Errorf("%v names %s, which is no flag", fe, fe.Field)
						continue
					}
					if fe.Type != field.ErrorTypeRequired && !strings.Contains(fe.Error(), badValue(f, fe.Field)) {
						t.Errorf("%v does not show the value %s", fe, badValue(f, fe.Field))
					}
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("errors for %v\n%v\nfields %q, want %q", tc.args, err, got, tc.want)
			}
		})
	}
}

// badValue is the value the flag at path (--name or --name[i]) holds, as
// the error shows it.
func badValue(f *pflag.Flag, path string) string {
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		var i int
		if _, idx, ok := strings.Cut(path, "["); ok {
			for _, c := range strings.TrimSuffix(idx, "]") {
				i = i*10 + int(c-'0')
			}
		}
		return sv.GetSlice()[i]
	}
	return f.Value.String()
}

// TestConfig: what the command wires is what the flags say.
func TestConfig(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hcloud.yaml"), []byte("name: hcloud\nccm: {image: {tag: v9.9.9}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, _ := parsed(t, "--release-namespace=ccm", "--profile-overrides="+dir, "--metrics-addr=0", "--health-addr=:9441",
		"--pprof-addr=127.0.0.1:6060", "--events-addr=http://events.example/", "--enable-leader-election",
		"--uninstall-grace-period=1m", "--interval=2m", "--wait-interval=3s", "--helm-wait=false", "--helm-timeout=4m",
		"--concurrent=7", "--min-retry-delay=1s", "--gate-image=gate:1", "--gate-image-pull-policy=Always",
		"--image-pull-secrets=regcred", "--domain-labels=example.com/zone", "--ccm-lease-duration=20s",
		"--native-ccm-network-policy", "--native-ccm-cloud-api-ports=443,8443")
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg, err := o.Config("1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := cfg.Profiles.Get("hcloud"); !ok || p.CCM.Image.Tag != "v9.9.9" || !slices.Contains(cfg.Profiles.Names(), "aws") {
		t.Errorf("profiles %v: want the built-in ones, hcloud's with the override's tag", cfg.Profiles.Names())
	}
	m := cfg.Manager
	if m.Metrics.BindAddress != "0" || m.HealthProbeBindAddress != ":9441" || m.PprofBindAddress != "127.0.0.1:6060" ||
		!m.LeaderElection || m.LeaderElectionNamespace != "ccm" || m.LeaderElectionID != "ccm-coordinator.hybridccm.io" ||
		*m.LeaseDuration != 35*time.Second || *m.RenewDeadline != 30*time.Second || *m.RetryPeriod != 5*time.Second ||
		!m.LeaderElectionReleaseOnCancel || m.Scheme == nil || len(m.Cache.ByObject) == 0 {
		t.Errorf("manager options %+v", m)
	}
	if cfg.Controller.MaxConcurrentReconciles != 7 || cfg.Controller.RateLimiter.MinRetryDelay != time.Second ||
		cfg.Client.QPS != 50 || cfg.EventsAddr != "http://events.example/" {
		t.Errorf("controller %+v, client %+v, events %q", cfg.Controller, cfg.Client, cfg.EventsAddr)
	}
	if h := cfg.Helm; h.Wait || h.Timeout != 4*time.Minute || h.BuiltinChartVersion != "1.2.3" {
		t.Errorf("helm options %+v", h)
	}
	g := cfg.Gate
	if g.Image != "gate:1" || g.ImagePullPolicy != "Always" || g.NetworkPolicy == nil ||
		!slices.Equal(g.NetworkPolicy.CloudAPI.Ports, []int32{443, 8443}) || !slices.Equal(g.NetworkPolicy.APIServer.Ports, []int32{6443}) ||
		g.NetworkPolicy.Validate() != nil {
		t.Errorf("gate %+v, network policy %+v", g, g.NetworkPolicy)
	}

	var r controller.NativeCCMReconciler
	cfg.ApplyTo(&r)
	if r.Profiles != cfg.Profiles || r.Namespace != "ccm" || !slices.Equal(r.ImagePullSecrets, []string{"regcred"}) ||
		!slices.Equal(r.DomainLabels, append(slices.Clone(domain.BuiltinKeys), "example.com/zone")) ||
		r.UninstallGracePeriod != time.Minute || r.Interval != 2*time.Minute || r.RetryInterval != 3*time.Second ||
		r.Health.LeaseDuration != 20*time.Second || r.Health.CrashLoopRestarts != 3 {
		t.Errorf("reconciler settings: namespace %q, pull secrets %v, domain labels %v, grace %s, interval %s, retry %s, health %+v",
			r.Namespace, r.ImagePullSecrets, r.DomainLabels, r.UninstallGracePeriod, r.Interval, r.RetryInterval, r.Health)
	}

	o, _ = parsed(t)
	if cfg, err := o.Config(""); err != nil || cfg.Gate.NetworkPolicy != nil {
		t.Errorf("without --native-ccm-network-policy: %v, network policy %+v", err, cfg.Gate.NetworkPolicy)
	}
}
