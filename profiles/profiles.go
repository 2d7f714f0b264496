// Package profiles embeds the built-in native CCM profiles (<platform>.yaml).
//
// The files are data; coordinator/profile owns their schema, loading and
// validation. This package must contain nothing but the embedding.
package profiles

import "embed"

// FS holds every built-in profile at its root.
//
//go:embed *.yaml
var FS embed.FS
