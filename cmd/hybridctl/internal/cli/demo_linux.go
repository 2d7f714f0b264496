//go:build linux && !nodemo

package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/hybrid-ccm/hybrid-ccm/cmd/hybridctl/internal/demo"
	"github.com/hybrid-ccm/hybrid-ccm/test/netns"
)

func newDemoCommand() *cobra.Command {
	var (
		nonInteractive bool
		exitWhenDone   bool
		timeout        time.Duration
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run Hybrid CCM on a real cluster on this machine: Talos machines of several clouds as real nodes, the product installed from its static manifests, an outage",
		Long: "demo brings up a real cluster on this machine (test/fleet): etcd and kube-apiserver from\n" +
			"$KUBEBUILDER_ASSETS, kube-controller-manager, kube-scheduler, and nine Talos machines (metal, aws,\n" +
			"hcloud, gcp) as real nodes from $HYBRID_CCM_CLUSTER_BINARIES: kubelet, containerd and kube-proxy\n" +
			"each, answering the Talos API on its own address (`make demo` builds and sets both), and cluster\n" +
			"DNS as Talos deploys it (CoreDNS, which `make demo` builds with hack/coredns.sh). It runs\n" +
			"`make release` into a registry the nodes pull from, applies docs/deploy/talos-ccm.yaml and\n" +
			"docs/deploy/ccm-coordinator.yaml as Talos applies them, and creates NativeCCMs for aws (the real\n" +
			"upstream AWS CCM, against a fake EC2), hcloud and gcp (test/testccm, against a fake cloud API).\n" +
			"It shows the nodes initialized with pod CIDRs, the kubelets' serving certificates approved (a\n" +
			"forged CSR denied), the native CCMs installed, running and gated, a foreign-node delete denied\n" +
			"by the fence, LoadBalancer Services served by their own cloud; then an outage in which machines\n" +
			"power off: the hcloud CCM deletes its deleted server's node, the aws CCM deletes its terminated\n" +
			"instance's node and taints the stopped one, a metal node is left alone. At start it prints how\n" +
			"to point kubectl at the cluster. It runs in a network namespace of its own (nothing leaves the\n" +
			"machine) and needs root. Ctrl-C stops and cleans up everything.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
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
				// cluster's bridge, the API server and every port it
				// serves must not meet another cluster, a test or a real
				// CCM on this machine, and nothing can reach beyond it.
				// This process only waits for it, passing Ctrl-C and
				// SIGTERM on, and removes its temporary files however it
				// ended (even killed).
				code, err := reexecWithTempDir()
				if err != nil {
					return err
				}
				os.Exit(code)
			}
			// Ctrl-C (SIGINT), SIGTERM or SIGHUP cancels ctx; demo.Run
			// then stops everything it started and returns nil.
			ctx, stop := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
			defer stop()
			return demo.Run(ctx, demo.Options{
				Out: cmd.OutOrStdout(), Interactive: interactive,
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
	cmd.Flags().BoolVar(&nonInteractive, "non-interactive", false, "print a log line per change instead of a live table (default when stdout is not a terminal)")
	cmd.Flags().BoolVar(&exitWhenDone, "exit-when-done", false, "exit once the end state is reached, non-zero if it is not as expected (default: true when non-interactive, false on a terminal)")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for the end state once the product is installed")
	return cmd
}

// runDirPrefix names the directory the demo's own process (in its network
// namespace) gets as TMPDIR.
const runDirPrefix = "hybrid-ccm-demo-run-"

// reexecWithTempDir runs the demo in a network namespace of its own
// (netns.Reexec) with a TMPDIR of its own, which it removes once the demo
// has ended, whichever way: the cluster's state is undone by the cluster
// itself (or, after a SIGKILL, by the next cluster), the demo's files by
// this. A lock held while it runs tells a later demo whether such a
// directory is left over from one that was killed with its parent; those
// are removed first.
func reexecWithTempDir() (int, error) {
	removeStaleRunDirs()
	dir, err := os.MkdirTemp("", runDirPrefix)
	if err != nil {
		return 0, err
	}
	killed := false
	defer func() { removeRunDir(dir, killed) }()
	lock, err := os.Create(filepath.Join(dir, ".lock"))
	if err != nil {
		return 0, err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return 0, err
	}
	prev, had := os.LookupEnv("TMPDIR")
	if err := os.Setenv("TMPDIR", dir); err != nil {
		return 0, err
	}
	code, err := netns.Reexec()
	// 128+n: a signal ended the demo; it could not stop what it started
	killed = err == nil && code > 128
	if had {
		_ = os.Setenv("TMPDIR", prev)
	} else {
		_ = os.Unsetenv("TMPDIR")
	}
	return code, err
}

// removeRunDir removes the demo's run directory. A demo that was killed
// could not stop its processes: they die with it (parent-death signals),
// but not at once, and may still write into dir, or create it again, for a
// moment after it is gone. For such a demo the removal is retried until
// dir stays gone for a second (at most stragglerWait).
func removeRunDir(dir string, killed bool) {
	wait := time.Duration(0)
	if killed {
		wait = stragglerWait
	}
	var err error
	for deadline, gone := time.Now().Add(wait), 0; ; time.Sleep(250 * time.Millisecond) {
		if err = os.RemoveAll(dir); err == nil {
			gone++
		} else {
			gone = 0
		}
		if (err == nil && (!killed || gone >= 4)) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "hybridctl: cannot remove the demo's temporary files %s: %v\n", dir, err)
	}
}

// stragglerWait bounds how long the first process keeps removing the run
// directory of a demo that was killed.
const stragglerWait = 30 * time.Second

// removeStaleRunDirs removes the run directories of demos whose first
// process is gone (its lock is free).
func removeStaleRunDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), runDirPrefix+"*"))
	for _, d := range dirs {
		f, err := os.Open(filepath.Join(d, ".lock"))
		if err != nil {
			continue
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			_ = os.RemoveAll(d)
		}
		f.Close()
	}
}
