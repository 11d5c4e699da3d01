//go:build tools

// Package tools records the main packages built from this module so that
// `go mod tidy` keeps their dependencies.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
	_ "sigs.k8s.io/kwok/cmd/kwokctl"
)
