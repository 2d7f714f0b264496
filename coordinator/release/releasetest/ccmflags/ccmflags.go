// Package ccmflags parses a CCM container's arguments with the flag set
// every upstream CCM is built with (k8s.io/cloud-provider/app). Only tests
// import it. It is apart from releasetest because that flag set brings the
// CCM framework's whole graph (the generic API server, CEL, an etcd client):
// the tests that only decode manifests, and the fuzz target that renders
// the chart (go test -fuzz recompiles every package it links, instrumented),
// do without it.
package ccmflags

import (
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/wait"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/cloud-provider/app"
	cloudcontrollerconfig "k8s.io/cloud-provider/app/config"
	"k8s.io/cloud-provider/names"
	"k8s.io/cloud-provider/options"
	cliflag "k8s.io/component-base/cli/flag"
)

// Parse parses argv (a CCM container's command without the binary,
// then its args) with the flag set every upstream CCM is built with
// (k8s.io/cloud-provider/app, normalized as component-base's cli.Run does)
// and returns it: what the CCM would run with. A parse error is what makes
// the CCM exit at start.
func Parse(t testing.TB, argv []string) (*pflag.FlagSet, error) {
	t.Helper()
	opts, err := options.NewCloudControllerManagerOptions()
	if err != nil {
		t.Fatal(err)
	}
	noCloud := func(*cloudcontrollerconfig.CompletedConfig) cloudprovider.Interface { return nil }
	cmd := app.NewCloudControllerManagerCommand(opts, noCloud, app.DefaultInitFuncConstructors,
		names.CCMControllerAliases(), cliflag.NamedFlagSets{}, wait.NeverStop)
	cmd.SetGlobalNormalizationFunc(cliflag.WordSepNormalizeFunc)
	fs := cmd.Flags()
	return fs, fs.Parse(argv)
}

// Value is the value the CCM runs with for the flag name (without dashes).
func Value(t testing.TB, fs *pflag.FlagSet, name string) string {
	t.Helper()
	f := fs.Lookup(name)
	if f == nil {
		t.Fatalf("the CCM has no flag --%s", name)
	}
	return f.Value.String()
}
