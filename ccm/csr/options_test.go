package csr

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestFlags(t *testing.T) {
	tests := []struct {
		name string
		// args are the command-line flags.
		args []string
		// want is the expected result, starting from NewOptions().
		want func(o *Options)
	}{
		{name: "defaults", want: func(*Options) {}},
		{name: "everything", args: []string{
			"--csr-min-expiration=30m", "--csr-max-expiration=720h", "--csr-wait-for-initialization=false",
			"--csr-allowed-ip-ranges=10.0.0.0/8, fd00::/8", "--csr-allowed-dns-suffixes=a.example.com,b.example.com", "--csr-workers=8",
		}, want: func(o *Options) {
			o.MinExpiration, o.MaxExpiration, o.WaitForInitialization, o.Workers = 30*time.Minute, 720*time.Hour, false, 8
			o.AllowedIPRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
			o.AllowedDNSSuffixes = []string{"a.example.com", "b.example.com"}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, want := NewOptions(), NewOptions()
			tt.want(want)
			fs := pflag.NewFlagSet("talos-ccm", pflag.ContinueOnError)
			got.AddFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			if err := got.Validate(); err != nil {
				t.Fatal(err)
			}
			if got.MinExpiration != want.MinExpiration || got.MaxExpiration != want.MaxExpiration ||
				got.WaitForInitialization != want.WaitForInitialization || got.Workers != want.Workers ||
				!slices.Equal(got.AllowedIPRanges, want.AllowedIPRanges) || !slices.Equal(got.AllowedDNSSuffixes, want.AllowedDNSSuffixes) {
				t.Fatalf("parsed %+v, want %+v", got, want)
			}
		})
	}

	fs := pflag.NewFlagSet("talos-ccm", pflag.ContinueOnError)
	NewOptions().AddFlags(fs)
	if err := fs.Parse([]string{"--csr-allowed-ip-ranges=10.0.0.0/33"}); err == nil {
		t.Fatal("an invalid CIDR was accepted")
	}
	if got := NewOptions(); got.MinExpiration != time.Hour || got.MaxExpiration != 367*24*time.Hour || !got.WaitForInitialization || got.Workers != 4 ||
		len(got.AllowedIPRanges) != 0 || len(got.AllowedDNSSuffixes) != 0 {
		t.Fatalf("defaults changed: %+v", got)
	}
}
