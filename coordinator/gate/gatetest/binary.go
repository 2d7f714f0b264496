package gatetest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/client-go/rest"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy"
	"github.com/hybrid-ccm/hybrid-ccm/test/benchproc"
	"github.com/hybrid-ccm/hybrid-ccm/test/testbin"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// BuildGate returns the path of cmd/ccm-gate as its image has it (static and
// stripped): the run's, taken out of its ccm-gate image (test/testbin), or,
// without one, built into dir (benchproc.Build).
func BuildGate(dir string) (string, error) {
	if bin, ok, err := testbin.Release("ccm-gate"); ok {
		return bin, err
	}
	bin := filepath.Join(dir, "ccm-gate")
	if err := benchproc.Build(testenv.RepoRoot(), bin, "./cmd/ccm-gate"); err != nil {
		return "", err
	}
	return bin, nil
}

// Gate is a running ccm-gate process: HTTPS on loopback with its own serving
// certificate, by default forwarding the caller's token (extra flags such as
// --credentials=own --client-token-file=... make it the sidecar's mode).
type Gate struct {
	Cmd *exec.Cmd
	// Config reaches the API server through the gate with token.
	Config *rest.Config
	// Log is the gate's output file.
	Log string
	// Health and Metrics are the addresses of the probe and metrics listeners.
	Health, Metrics string
}

// StartGate runs bin for platform in front of upstream's API server (TLS trust
// taken from upstream; its credentials are not used: the gate forwards the
// caller's), with its files in dir, and waits until it is ready.
//
// Its ports are free when chosen (FreePort), but another test process may
// take one before the gate binds it: a gate that says so is started again on
// other ports, a few times.
func StartGate(bin, dir, platform string, upstream *rest.Config, token string, extra ...string) (*Gate, error) {
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := WriteKubeconfig(upstream, kubeconfig); err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		g, err := startGate(bin, dir, platform, kubeconfig, token, extra...)
		if err == nil || !errors.Is(err, errPortTaken) || attempt == 5 {
			return g, err
		}
	}
}

// errPortTaken: a port chosen for the gate was taken before it bound it.
var errPortTaken = errors.New("a port chosen for ccm-gate was taken before it bound it")

func startGate(bin, dir, platform, kubeconfig, token string, extra ...string) (*Gate, error) {
	listen, health, metrics := FreePort(), FreePort(), FreePort()
	tlsDir := filepath.Join(dir, "tls")
	args := append([]string{"--listen=" + listen, "--health-listen=" + health, "--metrics-listen=" + metrics, "--tls-dir=" + tlsDir,
		"--kubeconfig=" + kubeconfig, "--platform=" + platform, "--credentials=forward", "--v=0"}, extra...)
	logPath := filepath.Join(dir, "ccm-gate.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// The gate dies with the test process, however that ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, err
	}
	_ = logFile.Close() // the child has its own descriptor
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get("http://" + health + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		out, _ := os.ReadFile(logPath)
		if taken := bytes.Contains(out, []byte("address already in use")); taken || time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if taken {
				return nil, fmt.Errorf("%w:\n%s", errPortTaken, out)
			}
			return nil, fmt.Errorf("ccm-gate never became ready: %v\n%s", err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &Gate{Cmd: cmd, Log: logPath, Health: health, Metrics: metrics, Config: &rest.Config{Host: "https://" + listen,
		TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(tlsDir, proxy.CertFile)}, BearerToken: token, QPS: -1, Burst: -1}}, nil
}

// Stop kills the gate and waits for it.
func (g *Gate) Stop() {
	_ = g.Cmd.Process.Kill()
	_ = g.Cmd.Wait()
}

// FreePort returns a loopback address with a port nobody listens on now.
func FreePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}
