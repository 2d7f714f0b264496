// Command testpod is the program the pod runner's tests run in their pods: it
// reports what it sees (user, env, files, its identity at the API server) as
// one "REPORT {json}" line, records when it started in an order file, and
// serves probes whose results the test switches over HTTP.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"flag"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Report is what the program saw.
type Report struct {
	Name     string            `json:"name"`
	Args     []string          `json:"args"`
	UID      int               `json:"uid"`
	GID      int               `json:"gid"`
	Groups   []int             `json:"groups"`
	Cwd      string            `json:"cwd"`
	Hostname string            `json:"hostname"`
	Env      map[string]string `json:"env"`
	Files    map[string]string `json:"files"`    // path -> content or "error: ..."
	Writable map[string]string `json:"writable"` // path -> "ok" or the error
	// User and PodName are the in-cluster identity (SelfSubjectReview), or
	// APIError says why there is none.
	User     string `json:"user,omitempty"`
	PodName  string `json:"podName,omitempty"`
	APIError string `json:"apiError,omitempty"`
	Order    string `json:"order,omitempty"`
}

func main() {
	var (
		name      = flag.String("name", "testpod", "name written to the order file")
		orderFile = flag.String("order-file", "", "file to append the name to once started")
		files     = flag.String("files", "", "comma-separated files to report")
		writable  = flag.String("try-write", "", "comma-separated directories to try writing to")
		inCluster = flag.Bool("in-cluster", false, "report the in-cluster identity")
		listen    = flag.String("listen", "", "HTTP probe address")
		tlsListen = flag.String("tls-listen", "", "HTTPS probe address (self-signed)")
		failStart = flag.Int("startup-failures", 0, "/startz fails this many times first")
		exitCode  = flag.Int("exit", -1, "exit with this code after reporting")
		message   = flag.String("message", "", "termination message written before exiting")
		msgPath   = flag.String("message-path", "/dev/termination-log", "termination message path")
		stderr    = flag.String("stderr", "", "written to stderr before exiting")
	)
	flag.String("literal", "", "ignored (tests expansion)")
	flag.String("unknown", "", "ignored (tests expansion)")
	flag.Parse()
	r := Report{Name: *name, Args: os.Args[1:], UID: os.Getuid(), GID: os.Getgid(), Env: map[string]string{}, Files: map[string]string{}, Writable: map[string]string{}}
	r.Hostname, _ = os.Hostname()
	r.Groups, _ = os.Getgroups()
	r.Cwd, _ = os.Getwd()
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		r.Env[k] = v
	}
	for _, f := range split(*files) {
		if b, err := os.ReadFile(f); err != nil {
			r.Files[f] = "error: " + err.Error()
		} else {
			r.Files[f] = string(b)
		}
	}
	for _, d := range split(*writable) {
		if err := os.WriteFile(d+"/written-by-"+*name, []byte("x"), 0o644); err != nil {
			r.Writable[d] = err.Error()
		} else {
			r.Writable[d] = "ok"
		}
	}
	if *inCluster {
		whoami(&r)
	}
	var started atomic.Bool
	markStarted := func() {
		if started.Swap(true) || *orderFile == "" {
			return
		}
		f, err := os.OpenFile(*orderFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o666)
		if err == nil {
			fmt.Fprintln(f, *name)
			f.Close()
		}
	}
	if *failStart == 0 {
		markStarted()
	}
	if *orderFile != "" {
		b, _ := os.ReadFile(*orderFile)
		r.Order = string(b)
	}
	b, _ := json.Marshal(r)
	fmt.Printf("REPORT %s\n", b)
	if *exitCode >= 0 {
		if *message != "" {
			_ = os.WriteFile(*msgPath, []byte(*message), 0o644)
		}
		if *stderr != "" {
			fmt.Fprintln(os.Stderr, *stderr)
		}
		os.Exit(*exitCode)
	}
	var ready, live atomic.Bool
	ready.Store(true)
	live.Store(true)
	var startCalls atomic.Int64
	mux := http.NewServeMux()
	status := func(ok bool, w http.ResponseWriter) {
		if !ok {
			http.Error(w, "no", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	}
	mux.HandleFunc("/startz", func(w http.ResponseWriter, _ *http.Request) {
		ok := startCalls.Add(1) > int64(*failStart)
		if ok {
			markStarted()
		}
		status(ok, w)
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { status(ready.Load(), w) })
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { status(live.Load(), w) })
	mux.HandleFunc("/set", func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		if v := q.Get("ready"); v != "" {
			ready.Store(v == "true")
		}
		if v := q.Get("live"); v != "" {
			live.Store(v == "true")
		}
		fmt.Fprintln(w, "ok")
	})
	errs := make(chan error, 2)
	if *listen != "" {
		go func() { errs <- http.ListenAndServe(*listen, mux) }()
	}
	if *tlsListen != "" {
		srv := &http.Server{Addr: *tlsListen, Handler: mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{selfSigned()}}}
		go func() { errs <- srv.ListenAndServeTLS("", "") }()
	}
	if *listen == "" && *tlsListen == "" {
		select {}
	}
	fmt.Fprintln(os.Stderr, <-errs)
	os.Exit(1)
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func whoami(r *Report) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		r.APIError = err.Error()
		return
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		r.APIError = err.Error()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rev, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		r.APIError = err.Error()
		return
	}
	r.User = rev.Status.UserInfo.Username
	if v := rev.Status.UserInfo.Extra["authentication.kubernetes.io/pod-name"]; len(v) > 0 {
		r.PodName = v[0]
	}
}

func selfSigned() tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "testpod"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		panic(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
