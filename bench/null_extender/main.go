// Command null-extender is the thinnest scheduler extender kube-scheduler can call: the floor
// under any extender (ours, HAMi's Go one) for bench/bench_scheduler.py --floor.
//
// POST /filter answers the first candidate node and decides nothing else; POST /bind forwards a
// Binding to the API server, as an extender with bindVerb must. Standard library only, so it
// builds offline: go build -o null-extender main.go
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"time"
)

type filterArgs struct {
	NodeNames []string `json:"NodeNames"`
}

type filterResult struct {
	NodeNames   []string          `json:"NodeNames"`
	FailedNodes map[string]string `json:"FailedNodes"`
	Error       string            `json:"Error"`
}

type bindArgs struct {
	PodName      string `json:"PodName"`
	PodNamespace string `json:"PodNamespace"`
	PodUID       string `json:"PodUID"`
	Node         string `json:"Node"`
}

type bindResult struct {
	Error string `json:"Error"`
}

func answer(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve /filter and /bind on")
	api := flag.String("api", "", "API server URL (https://host:port)")
	caFile := flag.String("ca", "", "PEM file of the API server's CA")
	tokenFile := flag.String("token-file", "", "file holding a bearer token for the API server")
	flag.Parse()

	ca, err := os.ReadFile(*caFile)
	if err != nil {
		log.Fatalf("-ca: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		log.Fatalf("-ca %s: no certificate in it", *caFile)
	}
	token, err := os.ReadFile(*tokenFile)
	if err != nil {
		log.Fatalf("-token-file: %v", err)
	}
	bearer := "Bearer " + string(bytes.TrimSpace(token))
	client := &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:     &tls.Config{RootCAs: pool},
			ForceAttemptHTTP2:   true,
			MaxIdleConnsPerHost: 32,
		},
	}

	mux := http.NewServeMux()
	mux.HandleFunc("POST /filter", func(w http.ResponseWriter, r *http.Request) {
		var args filterArgs
		if err := json.NewDecoder(r.Body).Decode(&args); err != nil || len(args.NodeNames) == 0 {
			answer(w, filterResult{Error: fmt.Sprintf("no candidate nodes (%v)", err)})
			return
		}
		answer(w, filterResult{NodeNames: args.NodeNames[:1], FailedNodes: map[string]string{}})
	})
	mux.HandleFunc("POST /bind", func(w http.ResponseWriter, r *http.Request) {
		var args bindArgs
		if err := json.NewDecoder(r.Body).Decode(&args); err != nil {
			answer(w, bindResult{Error: err.Error()})
			return
		}
		body, _ := json.Marshal(map[string]any{
			"apiVersion": "v1",
			"kind":       "Binding",
			"metadata":   map[string]any{"name": args.PodName, "namespace": args.PodNamespace, "uid": args.PodUID},
			"target":     map[string]any{"apiVersion": "v1", "kind": "Node", "name": args.Node},
		})
		url := fmt.Sprintf("%s/api/v1/namespaces/%s/pods/%s/binding", *api, args.PodNamespace, args.PodName)
		req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", bearer)
		resp, err := client.Do(req)
		if err != nil {
			answer(w, bindResult{Error: err.Error()})
			return
		}
		text, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 300 {
			answer(w, bindResult{Error: fmt.Sprintf("binding: %d %s", resp.StatusCode, text)})
			return
		}
		answer(w, bindResult{})
	})
	server := &http.Server{Addr: *listen, Handler: mux}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("-listen %s: %v", *listen, err)
	}
	fmt.Println(ln.Addr().String()) // the bench reads the port from the first line
	log.Fatal(server.Serve(ln))
}
