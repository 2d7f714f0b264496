package registry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	// The process TestPauseReapsChildren starts: it starts a child that
	// exits after a while, then becomes the pause program, which inherits
	// the child.
	if bin := os.Getenv(envExecPause); bin != "" {
		child := exec.Command(os.Args[0])
		child.Env = append(os.Environ(), envExecPause+"=", envSleep+"=2s")
		if err := child.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		err := syscall.Exec(bin, []string{bin}, os.Environ())
		fmt.Fprintln(os.Stderr, "exec pause:", err)
		os.Exit(3)
	}
	if d := os.Getenv(envSleep); d != "" {
		dur, _ := time.ParseDuration(d)
		time.Sleep(dur)
		os.Exit(0)
	}
	code := m.Run()
	if pauseOnce.dir != "" {
		_ = os.RemoveAll(pauseOnce.dir)
	}
	os.Exit(code)
}

const (
	envExecPause = "REGISTRY_TEST_EXEC_PAUSE"
	envSleep     = "REGISTRY_TEST_SLEEP"
)

// start starts a registry on a loopback port, closed when the test ends.
func start(t *testing.T, opts ...Option) *Registry {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r, err := Start(lis, t.TempDir(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}

// The registry speaks HTTPS with a certificate of its own CA, for the
// listener's address, 127.0.0.1, localhost and the hostname; HTTPClient
// trusts it, a client with only the system's roots does not.
func TestTLS(t *testing.T) {
	r := start(t)
	_, port, _ := net.SplitHostPort(r.Host())
	if !strings.HasPrefix(r.Host(), "127.0.0.1:") {
		t.Errorf("Host() = %q", r.Host())
	}
	if r.CAFile() != filepath.Join(filepath.Dir(r.LogFile()), "ca.crt") {
		t.Errorf("CAFile() = %s", r.CAFile())
	}
	names := []string{"127.0.0.1", "localhost"}
	if h, err := os.Hostname(); err == nil {
		names = append(names, h)
	}
	for _, n := range names {
		// Dial the listener whatever the name resolves to; verify the name.
		tr := r.HTTPClient().Transport.(*http.Transport).Clone()
		tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, r.Host())
		}
		resp, err := (&http.Client{Transport: tr}).Get("https://" + net.JoinHostPort(n, port) + "/v2/")
		if err != nil {
			t.Errorf("GET /v2/ as %s: %v", n, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET /v2/ as %s: %s", n, resp.Status)
		}
	}

	// The CA file is what the server's chain ends in.
	data, err := os.ReadFile(r.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		t.Fatalf("%s: no PEM certificate", r.CAFile())
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !ca.IsCA {
		t.Error("CA certificate is not a CA")
	}
	conn, err := tls.Dial("tcp", r.Host(), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	leaf := conn.ConnectionState().PeerCertificates[0]
	conn.Close()
	if err := leaf.CheckSignatureFrom(ca); err != nil {
		t.Errorf("server certificate not signed by %s: %v", r.CAFile(), err)
	}
	if err := leaf.VerifyHostname("127.0.0.1"); err != nil {
		t.Error(err)
	}

	// Without the CA: refused.
	plain := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: x509.NewCertPool()}}}
	if resp, err := plain.Get("https://" + r.Host() + "/v2/"); err == nil {
		resp.Body.Close()
		t.Error("a client without the CA was served")
	} else if !errors.As(err, new(*tls.CertificateVerificationError)) {
		t.Errorf("a client without the CA: %v, want a certificate verification error", err)
	}

	// The request log records what was asked.
	log, err := os.ReadFile(r.LogFile())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "GET /v2/") {
		t.Errorf("request log lacks GET /v2/:\n%s", log)
	}
}

// fakeListener has an address and can be closed, nothing else.
type fakeListener struct {
	net.Listener
	addr   net.Addr
	closed *bool
}

func (f fakeListener) Addr() net.Addr { return f.addr }
func (f fakeListener) Close() error   { *f.closed = true; return nil }

// TestHTTP1Only: a client that would speak HTTP/2 gets HTTP/1.1 (see
// http1Only: over HTTP/2 a push of several large blobs hangs).
func TestHTTP1Only(t *testing.T) {
	r := start(t)
	tr := r.HTTPClient().Transport.(*http.Transport).Clone()
	tr.ForceAttemptHTTP2 = true
	resp, err := (&http.Client{Transport: tr}).Get("https://" + r.Host() + "/v2/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 1 {
		t.Errorf("GET /v2/ over %s, want HTTP/1.1", resp.Proto)
	}
}

func TestStartNeedsSpecificAddress(t *testing.T) {
	for _, addr := range []net.Addr{
		&net.TCPAddr{IP: net.IPv4zero, Port: 5000},
		&net.TCPAddr{IP: net.IPv6unspecified, Port: 5000},
		&net.UnixAddr{Name: "/x.sock", Net: "unix"},
	} {
		closed := false
		if _, err := Start(fakeListener{addr: addr, closed: &closed}, t.TempDir()); err == nil || !strings.Contains(err.Error(), addr.String()) {
			t.Errorf("Start on %s: err = %v, want an error naming the address", addr, err)
		}
		if !closed {
			t.Errorf("Start on %s failed and left the listener open", addr)
		}
	}
}

func TestClose(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	r, err := Start(lis, dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if resp, err := r.HTTPClient().Get("https://" + r.Host() + "/v2/"); err == nil {
		resp.Body.Close()
		t.Error("served after Close")
	}
	if _, err := os.Stat(filepath.Join(dir, "ca.crt")); err != nil {
		t.Errorf("Close removed the CA: %v", err)
	}
}

// containerd reads hosts.toml's ca relative to the file: CAFile is absolute
// whatever dir Start was given.
func TestStartRelativeDir(t *testing.T) {
	t.Chdir(t.TempDir())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r, err := Start(lis, "reg")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if !filepath.IsAbs(r.CAFile()) {
		t.Errorf("CAFile() = %s, want an absolute path", r.CAFile())
	}
	if _, err := os.Stat(r.CAFile()); err != nil {
		t.Error(err)
	}
}
