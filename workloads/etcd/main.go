// Command etcd is etcd's server, built from its pinned Go module for the ctrl's tests: the
// server module's own directory does not build (its go.mod replaces modules by relative path),
// but a main package of our own that calls etcdmain does. scripts/test-deps.sh builds it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
