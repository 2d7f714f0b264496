// Package initpages lowers talos-ccm's peak resident set during package
// initialization. Initializing the thousand-odd packages that
// k8s.io/cloud-provider/app links runs code and reads data all over the
// executable, and the kernel maps each faulting page with its neighbours:
// by the time main runs, about 41 MiB of the executable is resident, on top
// of 9 MiB of heap, which was the process's peak at 1,000 nodes. None of it
// runs again, so talos-ccm gives those pages back (procmem.ReleaseDuringInit)
// three times: after the API machinery (package early), after the Kubernetes
// client's API types (this package), and first thing in main. Where the
// first two fall is the Go runtime's initialization order, which
// TestReleasePointsSplitInitialization checks; if it changed, the pages would
// be given back at other moments and all of them still in main.
package initpages

import (
	// The Kubernetes clientset and the scheme of every API group it serves:
	// the largest single initialization.
	_ "k8s.io/client-go/kubernetes"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/procmem"
	_ "github.com/hybrid-ccm/hybrid-ccm/cmd/talos-ccm/internal/initpages/early"
)

func init() { procmem.ReleaseDuringInit() }
