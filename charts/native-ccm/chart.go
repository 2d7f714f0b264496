// Package nativeccm embeds the generic lifecycle-only chart (this directory) so
// that ccm-coordinator installs it without a chart repository.
//
// The chart files are data; coordinator/release/helm loads them with the Helm SDK
// (and coordinator/release hashes them into the release digest).
// This package must contain nothing but the embedding.
package nativeccm

import "embed"

// Files are the chart's files, relative to the chart root.
//
//go:embed Chart.yaml values.yaml values.schema.json .helmignore all:templates
var Files embed.FS
