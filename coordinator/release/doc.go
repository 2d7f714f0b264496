// Package release describes a native CCM release without Helm: the Request a
// NativeCCM and its profile make (chart reference, values, digest), the
// lifecycle-only enforcement and the other mutators every rendered manifest
// goes through (Lifecycle, Mutator, Manifests), the RBAC a native CCM gets
// (LifecycleRules, LoadBalancerRules), and the words an engine reports in
// (Info, ChartError, ErrNameInUse, RefusedError).
//
// It must not import Helm: the gate, hybridctl and ccm-gate use it and link
// no Helm. Running a release (install, upgrade, rollback, uninstall with the
// Helm SDK) is coordinator/release/helm's job.
package release
