package helm

import (
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// TestMemberRegionNotSwallowedByContinuation: gcfg (the aws CCM's INI reader)
// takes an unquoted '\' at the end of a line as a line continuation. A
// credentials cloud.conf that ends in one, without a final newline, makes
// the chart's appended "[Global]" part of the previous value, and the
// member's Region = "<value>" a setting of the base's last section: the
// member then runs with the base's region (gcfg, checked by hand:
// Global.Region stays us-west-2, ServiceOverride "1" gets Region eu-west-1),
// while its view and fence are eu-west-1's nodes, which an aws CCM of another
// region reports as gone. The appended section must start after a line
// that cannot continue (a blank line between base and set does).
func TestMemberRegionNotSwallowedByContinuation(t *testing.T) {
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	p, _ := set.Get("aws")
	base := "[Global]\nRegion = us-west-2\n[ServiceOverride \"1\"]\nService = ec2\nURL = https://ec2.example \\"
	req, err := release.FromProfile(p, release.Instance{
		ReleaseName: "native-ccm-aws--eu-west-1", Namespace: "kube-system", Platform: "aws",
		CloudConfig: &release.CloudConfigFile{Base: base,
			Set: []release.CloudConfigSetting{release.SettingOf(p.Domain.CloudConfigRegion, "eu-west-1")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	_, conf := renderMemberCloudConfig(t, req, "native-ccm-aws--eu-west-1-cloud-config")
	lines := strings.Split(conf, "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) == "[Global]" && i > 0 && strings.HasSuffix(lines[i-1], "\\") {
			t.Fatalf("the member's [Global] section continues the base's last line %q (gcfg line continuation): its Region is not Global.Region; cloud.conf:\n%s", lines[i-1], conf)
		}
	}
}
