package main

import (
	"crypto/x509"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestPublicRootsWithoutSystemStore: the coordinator's image holds the
// binary alone, with no CA bundle, yet it must verify chart repositories and
// OCI registries served with public certificates. Run in a child with no
// system roots to find, the binary still has the public roots.
func TestPublicRootsWithoutSystemStore(t *testing.T) {
	if os.Getenv("HYBRID_CCM_ROOTS_CHILD") == "1" {
		pool, err := x509.SystemCertPool()
		if err != nil {
			t.Fatal(err)
		}
		//lint:ignore SA1019 the pool is the fallback one here, whose subjects are listed
		subjects := pool.Subjects()
		var found bool
		for _, s := range subjects {
			found = found || strings.Contains(string(s), "ISRG Root X1")
		}
		if len(subjects) < 50 || !found {
			t.Fatalf("no public roots without a system store: %d subjects, ISRG Root X1 among them: %v", len(subjects), found)
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPublicRootsWithoutSystemStore$", "-test.v")
	cmd.Env = append(os.Environ(), "HYBRID_CCM_ROOTS_CHILD=1", "SSL_CERT_FILE=/nonexistent/ca.crt", "SSL_CERT_DIR=/nonexistent")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(string(out), "--- PASS: TestPublicRootsWithoutSystemStore") {
		t.Fatalf("the child ran no check:\n%s", out)
	}
}
