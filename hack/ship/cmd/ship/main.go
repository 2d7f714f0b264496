// Command ship builds the images (images), pushes images and charts (release)
// and renders docs/deploy (manifests); `make images|release|manifests` run it.
// The work is in hack/ship (images) and hack/ship/publish (release, manifests).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
	"github.com/hybrid-ccm/hybrid-ccm/hack/ship/publish"
)

const usage = `usage: ship images|release|manifests [flags]

  images     build the images into an OCI image layout (--out, default bin/images)
  release    build the images, push them, their SBOMs and the charts to --registry;
             with --signing-key, sign every image and chart (cosign's format)
  manifests  render docs/deploy/*.yaml from the charts (--out, default docs/deploy)
             and each chart's README.md from its Chart.yaml and values.yaml
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cmd := os.Args[1]
	fs := flag.NewFlagSet("ship "+cmd, flag.ExitOnError)
	var (
		registry  = fs.String("registry", "", "registry the images and charts go to (default "+ship.DefaultRegistry+")")
		version   = fs.String("version", "", "version: image tag, chart version and appVersion (default: appVersion of charts/talos-ccm)")
		platforms = fs.String("platforms", strings.Join(ship.DefaultPlatforms, ","), "comma-separated os/arch list")
		images    = fs.String("images", strings.Join(ship.Images, ","), "comma-separated images to build")
		out       = fs.String("out", "", "output directory")
		keyFile   = fs.String("signing-key", "", "release: PEM private key (ECDSA or RSA; PKCS#8, SEC 1, PKCS#1 or cosign's encrypted key with "+publish.SigningPasswordEnv+") to sign every image and chart with, in cosign's format; empty: nothing is signed")
	)
	_ = fs.Parse(os.Args[2:])
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	opts := ship.Options{
		Registry:  *registry,
		Version:   *version,
		Platforms: split(*platforms),
		Images:    split(*images),
		Out:       *out,
		Log:       os.Stdout,
	}
	var err error
	switch cmd {
	case "images":
		if opts.Out == "" {
			opts.Out = "bin/images"
		}
		_, err = ship.Build(ctx, opts)
	case "release":
		if opts.Out == "" {
			opts.Out = "bin/images"
		}
		ro := publish.ReleaseOptions{Options: opts}
		if *keyFile != "" {
			// Before anything is built or pushed: a bad key stops here.
			if ro.Signer, err = publish.LoadSigningKey(*keyFile, []byte(os.Getenv(publish.SigningPasswordEnv))); err != nil {
				break
			}
		}
		_, err = publish.Release(ctx, ro)
	case "manifests":
		if opts.Out == "" {
			opts.Out = "docs/deploy"
		}
		if err = publish.WriteManifests(opts.Root, opts.Out, os.Stdout); err == nil {
			err = publish.WriteChartREADMEs(opts.Root, os.Stdout)
		}
	default:
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ship "+cmd+":", err)
		os.Exit(1)
	}
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
