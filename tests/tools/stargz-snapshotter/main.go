// stargz-snapshotter runs the stargz snapshotter (the library of Debian's
// golang-github-containerd-stargz-snapshotter-dev, 0.12) as a containerd proxy snapshotter
// on a unix socket: the job of upstream's containerd-stargz-grpc, which Debian does not
// package (its stargz-snapshotter package holds only ctr-remote). The tests build it
// offline and use it to pull imgbuild's eStargz images lazily, over FUSE.
//
// Written for the tests, not copied: it wires the snapshotter's filesystem (`fs`) and
// snapshotter (`snapshot`) to containerd's snapshot gRPC service, as upstream's service
// package does; that package is left out because its CRI keychain needs k8s.io/cri-api,
// which Debian does not package. Registries are reached without credentials, over plain
// HTTP on loopback (as upstream does for localhost) and HTTPS elsewhere. Background
// fetching is off, so the registry's log shows only what a container read (and the
// prefetched files).
//
// Usage: stargz-snapshotter -address SOCKET -root DIR. Runs until SIGINT or SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/contrib/snapshotservice"
	"github.com/containerd/containerd/reference"
	"github.com/containerd/containerd/remotes/docker"
	"github.com/containerd/containerd/snapshots/overlay/overlayutils"
	stargzfs "github.com/containerd/stargz-snapshotter/fs"
	"github.com/containerd/stargz-snapshotter/fs/config"
	"github.com/containerd/stargz-snapshotter/fs/layer"
	"github.com/containerd/stargz-snapshotter/fs/source"
	snbase "github.com/containerd/stargz-snapshotter/snapshot"
	"google.golang.org/grpc"
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "stargz-snapshotter: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	address := flag.String("address", "", "the unix socket to serve containerd's snapshot API on")
	root := flag.String("root", "", "the snapshotter's directory (snapshots, FUSE mounts, cache)")
	flag.Parse()
	if *address == "" || *root == "" {
		fail("-address and -root are required")
	}
	ctx := context.Background()

	var cfg config.Config
	// Only what the container reads comes from the registry: the measurements count it.
	cfg.NoBackgroundFetch = true
	cfg.NoPrometheus = true
	snapshotterRoot := filepath.Join(*root, "snapshotter")
	if err := os.MkdirAll(snapshotterRoot, 0o700); err != nil {
		fail("%v", err)
	}
	opaque := layer.OverlayOpaqueTrusted
	if userxattr, err := overlayutils.NeedsUserXAttr(snapshotterRoot); err == nil && userxattr {
		opaque = layer.OverlayOpaqueUser
	}
	fs, err := stargzfs.NewFilesystem(filepath.Join(*root, "stargz"), cfg,
		stargzfs.WithGetSources(source.FromDefaultLabels(hosts)),
		stargzfs.WithOverlayOpaqueType(opaque))
	if err != nil {
		fail("configuring the filesystem: %v", err)
	}
	snapshotter, err := snbase.NewSnapshotter(ctx, snapshotterRoot, fs, snbase.AsynchronousRemove)
	if err != nil {
		fail("starting the snapshotter: %v", err)
	}

	rpc := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(rpc, snapshotservice.FromSnapshotter(snapshotter))
	if err := os.MkdirAll(filepath.Dir(*address), 0o700); err != nil {
		fail("%v", err)
	}
	if err := os.RemoveAll(*address); err != nil {
		fail("%v", err)
	}
	listener, err := net.Listen("unix", *address)
	if err != nil {
		fail("listening on %s: %v", *address, err)
	}
	go func() {
		if err := rpc.Serve(listener); err != nil {
			fail("serving on %s: %v", *address, err)
		}
	}()

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	<-signals
	rpc.Stop()
	// Unmounts the FUSE layers.
	if err := snapshotter.Close(); err != nil {
		fail("closing: %v", err)
	}
}

// hosts reaches a registry without credentials: plain HTTP on loopback, HTTPS elsewhere.
func hosts(ref reference.Spec) ([]docker.RegistryHost, error) {
	host := ref.Hostname()
	client := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	registry := docker.RegistryHost{
		Client:       client,
		Authorizer:   docker.NewDockerAuthorizer(docker.WithAuthClient(client)),
		Host:         host,
		Scheme:       "https",
		Path:         "/v2",
		Capabilities: docker.HostCapabilityPull | docker.HostCapabilityResolve,
	}
	if localhost, _ := docker.MatchLocalhost(host); localhost {
		registry.Scheme = "http"
	}
	return []docker.RegistryHost{registry}, nil
}
