package iplist_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/iplist"
)

func TestAddrs(t *testing.T) {
	tests := []struct {
		name string
		// in is the list as written (an annotation, a flag)
		in string
		// want are the addresses in order; wantErr names the bad entry
		want    []string
		wantErr string
	}{
		{name: "empty", in: ""},
		{name: "blank entries only", in: " , ,"},
		{name: "one", in: "10.0.0.1", want: []string{"10.0.0.1"}},
		{name: "dual-stack with blanks", in: " fd00::1 , 10.0.0.1 ", want: []string{"fd00::1", "10.0.0.1"}},
		{name: "trailing comma", in: "10.0.0.1,", want: []string{"10.0.0.1"}},
		{name: "IPv4-mapped becomes IPv4", in: "::ffff:10.0.0.1", want: []string{"10.0.0.1"}},
		{name: "zone kept", in: "fe80::1%eth0", want: []string{"fe80::1%eth0"}},
		{name: "not an address", in: "10.0.0.1,web-1", wantErr: `"web-1"`},
		{name: "a CIDR is not an address", in: "10.0.0.0/24", wantErr: `"10.0.0.0/24"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkList(t, "Addrs", iplist.Addrs, tt.in, tt.want, tt.wantErr) })
	}
}

// checkList parses in with parse (called name): either the entries want, in
// order, or an error naming wantErr and no list.
func checkList[T interface{ String() string }](t *testing.T, name string, parse func(string) ([]T, error), in string, want []string, wantErr string) {
	t.Helper()
	got, err := parse(in)
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) || got != nil {
			t.Fatalf("%s(%q) = %v, %v; want an error naming %s", name, in, got, err, wantErr)
		}
		return
	}
	if err != nil || iplist.Join(got) != strings.Join(want, ",") {
		t.Fatalf("%s(%q) = %v, %v; want %v", name, in, got, err, want)
	}
}

func TestPrefixes(t *testing.T) {
	tests := []struct {
		name string
		// in is the list as written
		in string
		// want are the prefixes exactly as written (no masking); wantErr names the bad entry
		want    []string
		wantErr string
	}{
		{name: "empty", in: ""},
		{name: "dual-stack", in: "10.244.0.0/16, fd00::/56", want: []string{"10.244.0.0/16", "fd00::/56"}},
		{name: "host bits kept for the caller to report", in: "10.0.0.1/16", want: []string{"10.0.0.1/16"}},
		{name: "IPv4-mapped kept for the caller to report", in: "::ffff:10.0.0.0/104", want: []string{"::ffff:10.0.0.0/104"}},
		{name: "address without length", in: "10.0.0.0/16,10.1.0.0", wantErr: `"10.1.0.0"`},
		{name: "length out of range", in: "10.0.0.0/33", wantErr: `"10.0.0.0/33"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkList(t, "Prefixes", iplist.Prefixes, tt.in, tt.want, tt.wantErr) })
	}
}

func TestSortByFamily(t *testing.T) {
	ips := []netip.Addr{netip.MustParseAddr("fd00::1"), netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::2"), netip.MustParseAddr("10.0.0.2")}
	orig := slices.Clone(ips)
	if got := iplist.Join(iplist.SortByFamily(ips, false)); got != "10.0.0.1,10.0.0.2,fd00::1,fd00::2" {
		t.Errorf("IPv4 first: %s", got)
	}
	if got := iplist.Join(iplist.SortByFamily(ips, true)); got != "fd00::1,fd00::2,10.0.0.1,10.0.0.2" {
		t.Errorf("IPv6 first: %s", got)
	}
	if !slices.Equal(ips, orig) {
		t.Errorf("input changed: %v", ips)
	}
}

// A flag of CIDRs: each --flag replaces the list, and a bad entry is a flag
// error naming it.
func TestPrefixesValueFlag(t *testing.T) {
	var v iplist.PrefixesValue
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	fs.Var(&v, "ranges", "CIDRs")
	if err := fs.Parse([]string{"--ranges=10.0.0.0/8, fd00::/8", "--ranges=192.168.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	if got := fs.Lookup("ranges").Value.String(); got != "192.168.0.0/16" {
		t.Errorf("last flag wins: %q", got)
	}
	if err := fs.Parse([]string{"--ranges=10.0.0.0/8,nope"}); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("bad entry: %v", err)
	}
	if fs.Lookup("ranges").Value.Type() != "cidrs" {
		t.Errorf("type %q", fs.Lookup("ranges").Value.Type())
	}
}
