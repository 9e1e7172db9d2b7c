//go:build rdma

package main

import "github.com/farmem/farmem/fabric"

// Built with -tags rdma: --transport rdma dials memory servers over verbs.
func init() { rdmaDial = fabric.DialRDMA }
