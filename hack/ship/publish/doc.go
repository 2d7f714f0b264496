// Package publish publishes a release of this repository: the images
// (hack/ship builds them) pushed to an OCI registry, the Helm charts packaged
// with defaults that name exactly those images and pushed beside them, and the
// charts rendered into the static manifests under docs/deploy.
//
// It never changes a chart in the working tree: release copies are edited as
// structured data in memory. It is the part of hack/ship that links Helm.
package publish
