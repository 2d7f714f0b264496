package talos_test

import (
	"fmt"
	"net/netip"
	"os"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/test/netns"
)

// apidAddr is where a simulated apid answers as an endpoint of the Talos
// Service: an EndpointSlice may not hold a loopback address, so the tests
// run in a network namespace of their own (as root) with this address on lo.
var apidAddr = netip.MustParseAddr("10.250.0.1")

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		os.Exit(m.Run()) // the Talos Service test says it needs root
	}
	os.Exit(netns.Main(func() int {
		if err := netns.AddLoopbackAddress(1, apidAddr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}))
}
