// Command probe is the workload of the test cluster's own tests: `probe
// serve` prints one line and answers every HTTP request on :8080 with the
// pod's hostname; `probe get URL` prints what URL answers. A static binary,
// packed as an image by the tests.
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: probe serve | probe get URL")
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
		if len(os.Args) != 3 {
			fmt.Fprintln(os.Stderr, "usage: probe get URL")
			os.Exit(2)
		}
		c := &http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		fmt.Printf("%s", body)
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
}
