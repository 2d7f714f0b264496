// Package valuesfuzz fuzzes the values a user sets through a NativeCCM's
// spec.overrides.values, rendered by the Helm engine of package helm
// (FuzzNativeCCMChartValues). It is a package of its own so that what
// go test -fuzz compiles again, instrumented, is the engine and what it
// links (960 packages), not also what the engine's other tests link (a
// registry, client-go's fakes): measured cold on two cores, 231 s instead
// of 365 s. It holds no code.
package valuesfuzz
