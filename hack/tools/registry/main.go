// Command registry is the local cluster's OCI registry (hack/cluster.sh up
// starts it in the cluster's network namespace): go-containerregistry's
// registry, over plain HTTP, blobs on disk under -dir. Manifests live in
// memory, so they go with the process; the cluster's state goes with `down`
// anyway.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:5000", "address to listen on")
	dir := flag.String("dir", "", "directory of the blobs (required)")
	flag.Parse()
	if *dir == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: registry -addr HOST:PORT -dir DIR")
		os.Exit(2)
	}
	if err := serve(*addr, *dir); err != nil {
		fmt.Fprintln(os.Stderr, "registry:", err)
		os.Exit(1)
	}
}

func serve(addr, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	logger := log.New(os.Stderr, "registry: ", log.LstdFlags)
	srv := &http.Server{
		Addr:              addr,
		Handler:           registry.New(registry.Logger(logger), registry.WithBlobHandler(registry.NewDiskBlobHandler(dir))),
		ReadHeaderTimeout: 10 * time.Second,
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	logger.Printf("serving on http://%s, blobs in %s", addr, dir)
	select {
	case err := <-errc:
		return fmt.Errorf("listen on %s: %w", addr, err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shut down: %w", err)
	}
	return nil
}
