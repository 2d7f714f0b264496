// Package early gives back the executable's pages that package
// initialization has touched by the time Kubernetes' API machinery is
// initialized (about two thirds of talos-ccm's executable pages that
// initialization maps, in fewer than two thirds of its packages). See package
// initpages.
package early

import (
	// What this package follows: the Go runtime initializes a package once
	// every package it imports is initialized, and picks, of those ready,
	// the first in import-path order (the Go specification, "Package
	// initialization"), so this one right after these.
	_ "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/procmem"
)

func init() { procmem.ReleaseDuringInit() }
