package reach_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/reach"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
)

// TestReviewMessageOfHostileError: the gRPC status message of a failure is
// the answering apid's to choose (a node's own apid, forwarded by the
// endpoint). The event message carries it clipped, but neither terminal
// control sequences nor line breaks, and it stays valid UTF-8 however the
// clip falls.
func TestReviewMessageOfHostileError(t *testing.T) {
	hostile := "rpc error: code = Unavailable desc = connection refused\x1b[2J\x1b[1;1H\nFAKE LINE\r\u202e" + strings.Repeat("é", 400)
	msg := reach.Message([]talos.Failure{{Node: "10.1.1.1", Endpoint: "10.0.0.1:50000", Hop: talos.HopNode, Cause: talos.CauseRefused, Err: errors.New(hostile)}})
	if strings.ContainsAny(msg, "\x1b\n\r\u202e") {
		t.Errorf("event message carries control characters: %q", msg)
	}
	if !utf8.ValidString(msg) {
		t.Errorf("event message is not valid UTF-8: %q", msg)
	}
}
