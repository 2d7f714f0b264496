package proxy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Files of the serving certificate in the TLS directory. The CCM's kubeconfig
// names CertFile as its certificate authority (the certificate is self-signed).
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// LoadOrCreateServingCert returns the gate's loopback serving certificate from
// dir, creating a self-signed one (127.0.0.1, ::1, localhost) when there is
// none. A restarted gate container reuses the certificate in the pod's volume,
// so the CCM that trusts it keeps working.
func LoadOrCreateServingCert(dir string) (tls.Certificate, error) {
	const op = "proxy.LoadOrCreateServingCert"
	certPath, keyPath := filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile)
	if c, err := tls.LoadX509KeyPair(certPath, keyPath); err == nil {
		if leaf, err := x509.ParseCertificate(c.Certificate[0]); err == nil && time.Now().Before(leaf.NotAfter.Add(-24*time.Hour)) {
			return c, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return tls.Certificate{}, fmt.Errorf("%s: %s: %w", op, dir, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s: %w", op, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s: %w", op, err)
	}
	now := time.Now()
	tpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "ccm-gate"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s: %w", op, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s: %w", op, err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return tls.Certificate{}, fmt.Errorf("%s: %w", op, err)
	}
	// Key first, certificate last: a reader that sees the certificate finds its key.
	if err := writeAtomic(keyPath, keyPEM, 0o600); err != nil {
		return tls.Certificate{}, fmt.Errorf("%s: %w", op, err)
	}
	if err := writeAtomic(certPath, certPEM, 0o644); err != nil {
		return tls.Certificate{}, fmt.Errorf("%s: %w", op, err)
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(f.Name()) }()
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// HealthHandler serves the gate's probes (on their own listener, never on the
// proxy's, where /healthz belongs to the API server):
//
//	/livez    200 while the process serves
//	/readyz   200 once the node cache (and the Service history) has synced
//	          and the CCM's identity has been allowed Config.StartupAccess
//
// and, when g is not nil, /metrics from g. ccm-gate serves metrics on a
// listener of their own (MetricsHandler): probes must reach the pod IP,
// metrics need not leave the pod.
func (p *Proxy) HealthHandler(g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !p.access.ready.Load() {
			// what is missing is in the gate's log, not for whoever probes
			http.Error(w, "waiting for the CCM's permissions", http.StatusServiceUnavailable)
			return
		}
		if !p.Ready() {
			http.Error(w, "caches not synced", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	if g != nil {
		mux.Handle("/metrics", MetricsHandler(g))
	}
	return mux
}

// MetricsHandler serves /metrics from g, and nothing else.
func MetricsHandler(g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	return mux
}
