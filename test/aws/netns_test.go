package aws

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestOnlyLoopback: the tests of this package run where an unexpected cloud
// or metadata call cannot go out.
func TestOnlyLoopback(t *testing.T) {
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range ifs {
		names = append(names, i.Name)
	}
	if len(names) != 1 || names[0] != "lo" {
		t.Fatalf("interfaces %v, want only lo", names) // and dial nothing
	}
	// No route but loopback: a dial fails locally, nothing is sent.
	_, err = net.DialTimeout("tcp", "192.0.2.1:443", 2*time.Second) // TEST-NET-1
	if !errors.Is(err, syscall.ENETUNREACH) {
		t.Errorf("dial outside loopback: %v, want network unreachable", err)
	}
	// The metadata service's address is on lo (refused, not unreachable):
	// only the test's fake answers there, while a test runs it.
	c, err := net.DialTimeout("tcp", imdsAddr.String()+":80", 2*time.Second)
	if err == nil {
		_ = c.Close()
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial the metadata address: %v, want connection refused", err)
	}
}
