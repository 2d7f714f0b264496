// Package controller owns the NativeCCM reconciler. For each NativeCCM it runs
// the same steps, one function each, in order: observe (the profile and
// overrides, the upstream CCM release for the API server's minor, the
// platform's nodes, conflicts in the cluster), decide (the
// install policy, the credentials), gate (for a wanted release: the fence,
// status.gate and the view, through the Mutators hook), the release action
// chosen from the release's state (install, upgrade with rollback, uninstall
// or nothing, run by the release engine), health (is the CCM working), and a
// summary that records the outcome as Flux-style conditions, events and status.
//
// It never imports Helm: it describes releases with coordinator/release and runs
// them through ReleaseEngine (coordinator/release/helm, wired in by
// cmd/ccm-coordinator).
package controller
