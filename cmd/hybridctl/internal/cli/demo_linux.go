//go:build linux && !nodemo

package cli

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/hybrid-ccm/hybrid-ccm/cmd/hybridctl/internal/demo"
	"github.com/hybrid-ccm/hybrid-ccm/test/netns"
)

func newDemoCommand() *cobra.Command {
	var (
		binDir         string
		nonInteractive bool
		exitWhenDone   bool
		timeout        time.Duration
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run Hybrid CCM locally: real control plane, simulated Talos nodes of several clouds, real controllers and native CCM pods",
		Long: "demo starts a real kube-apiserver + etcd (from $KUBEBUILDER_ASSETS, which `make demo` builds),\n" +
			"a simulated Talos endpoint with nodes on aws, hcloud, gcp and metal speaking the real Talos API,\n" +
			"a fake cloud API on loopback, talos-ccm and ccm-coordinator as real processes, and a pod runner\n" +
			"that runs the native CCM pods the coordinator installs (the ccm-gate image built from this\n" +
			"checkout, test/testccm standing in for the upstream CCM images; both cached under\n" +
			"${XDG_CACHE_HOME:-~/.cache}/hybrid-ccm/demo). It registers nodes and kubelet-serving CSRs as\n" +
			"kubelets do and shows them initialized and approved (a forged CSR is denied), the native CCMs\n" +
			"installed, running (their pods hold their leases) and gated, a foreign-node delete denied by\n" +
			"the gate; then an outage: a deleted hcloud server's node is deleted by the hcloud CCM, a stopped\n" +
			"aws instance's node tainted by the aws CCM, a powered-off metal node left alone. It runs in a\n" +
			"network namespace of its own (loopback only, no port shared with the machine) and needs root\n" +
			"for that and for the pod runner (mount namespaces, chroot). Ctrl-C stops and cleans up everything.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if binDir == "" {
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				binDir = filepath.Dir(exe)
			}
			interactive := !nonInteractive && term.IsTerminal(int(os.Stdout.Fd()))
			if !cmd.Flags().Changed("exit-when-done") {
				exitWhenDone = !interactive
			}
			parent := cmd.Context()
			if parent == nil {
				parent = context.Background()
			}
			if os.Geteuid() != 0 {
				return demo.ErrNotRoot
			}
			if !netns.Isolated() {
				// The demo runs in a network namespace of its own: the
				// native CCM pods take their profiles' fixed ports, which
				// must not meet another demo, a test or a real CCM on this
				// machine, and nothing can listen beyond loopback. This
				// process only waits for it, passing Ctrl-C and SIGTERM on.
				code, err := netns.Reexec()
				if err != nil {
					return err
				}
				os.Exit(code)
			}
			// Ctrl-C (SIGINT) or SIGTERM cancels ctx; demo.Run then stops
			// everything it started and returns nil.
			ctx, stop := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
			defer stop()
			return demo.Run(ctx, demo.Options{
				Out: cmd.OutOrStdout(), Interactive: interactive, BinDir: binDir,
				ExitWhenDone: exitWhenDone, Timeout: timeout,
				TerminalSize: func() (int, int) {
					w, h, err := term.GetSize(int(os.Stdout.Fd()))
					if err != nil {
						return 0, 0
					}
					return w, h
				},
			})
		},
	}
	cmd.Flags().StringVar(&binDir, "bin-dir", "", "directory with the talos-ccm and ccm-coordinator binaries (default: next to hybridctl)")
	cmd.Flags().BoolVar(&nonInteractive, "non-interactive", false, "print a log line per change instead of a live table (default when stdout is not a terminal)")
	cmd.Flags().BoolVar(&exitWhenDone, "exit-when-done", false, "exit once the end state is reached, non-zero if it is not as expected (default: true when non-interactive, false on a terminal)")
	cmd.Flags().DurationVar(&timeout, "timeout", 4*time.Minute, "how long to wait for the end state")
	return cmd
}
