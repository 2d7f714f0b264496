// Command probe is the workload of the test cluster's own tests and of the
// fleet's: `probe serve` prints one line and answers every HTTP request on
// :8080 with the pod's hostname; `probe get URL` prints what URL answers;
// `probe lookup NAME` prints the addresses NAME resolves to through the
// pod's resolv.conf (cluster DNS), one a line, sorted; `probe cert
// HOST:PORT` prints the IP addresses of the certificate the TLS server
// there presents, one a line (it only reads the certificate: it trusts
// nothing and sends none). A static binary, packed as an image by the
// tests.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"time"
)

const usage = "usage: probe serve | probe get URL | probe lookup NAME | probe cert HOST:PORT"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		host, _ := os.Hostname()
		fmt.Printf("probe serving on :8080 as %s\n", host)
		err := http.ListenAndServe(":8080", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprint(w, host)
		}))
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	case "get":
		arg()
		c := &http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		fmt.Printf("%s", body)
	case "lookup":
		arg()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		addrs, err := net.DefaultResolver.LookupHost(ctx, os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		slices.Sort(addrs)
		for _, a := range addrs {
			fmt.Println(a)
		}
	case "cert":
		arg()
		ips, err := certIPs(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for _, ip := range ips {
			fmt.Println(ip)
		}
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n%s\n", os.Args[1], usage)
		os.Exit(2)
	}
}

// arg exits unless the command has exactly one argument.
func arg() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
}

// certIPs are the IP addresses of the leaf certificate the TLS server at
// addr presents. The server may go on to refuse a client without a
// certificate of its own (mutual TLS): the certificate is read before.
func certIPs(addr string) ([]string, error) {
	var leaf *x509.Certificate
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: &tls.Config{
		InsecureSkipVerify: true, // read, not trusted
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("no certificate")
			}
			c, err := x509.ParseCertificate(raw[0])
			leaf = c
			return err
		},
	}}
	conn, err := d.DialContext(context.Background(), "tcp", addr)
	if conn != nil {
		conn.Close()
	}
	if leaf == nil {
		return nil, fmt.Errorf("no certificate from %s: %v", addr, err)
	}
	var ips []string
	for _, ip := range leaf.IPAddresses {
		ips = append(ips, ip.String())
	}
	return ips, nil
}
