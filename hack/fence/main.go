// Command fence writes the ccm-coordinator chart's templates/fence.yaml from
// gate.FenceTemplate (the one source of the fence). `make generate` runs it;
// charts/test checks that the file is current.
//
//	go run ./hack/fence [path]
package main

import (
	"fmt"
	"os"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
)

func main() {
	path := "charts/ccm-coordinator/templates/fence.yaml"
	if len(os.Args) > 1 {
		path = os.Args[1]
	}
	b, err := gate.FenceTemplate()
	if err == nil {
		err = os.WriteFile(path, b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fence:", err)
		os.Exit(1)
	}
}
