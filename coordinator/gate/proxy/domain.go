package proxy

import (
	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/nodeview"
)

// ValidateDomainSelector reports whether ccm-gate would take domain as its
// --domain-selector.
func ValidateDomainSelector(domain string) error {
	_, err := nodeview.ViewRequirements(names.PlatformLabel, "platform", domain)
	return err
}
