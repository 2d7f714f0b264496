// Package controller owns the NativeCCM reconciler: it resolves a NativeCCM's
// profile, counts the nodes of its platform, checks credentials, decides whether
// the native CCM release should exist, and asks the release engine to install,
// upgrade, roll back or uninstall it. It records what it did as Flux-style
// conditions and events, and reports conflicts it finds in the cluster.
//
// It never imports Helm: it describes releases with coordinator/release and runs
// them through ReleaseEngine (coordinator/release/helm, wired in by
// cmd/ccm-coordinator).
package controller
