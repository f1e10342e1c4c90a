// Package check decodes the objects `helm template` renders from the iop
// chart (deploy/helm/iop) strictly into the Kubernetes API types, and its
// tests render the chart with several values sets and check what it
// promises: probes, a non-root read-only container, Services and a
// PodDisruptionBudget that select the pods, Secrets for keys and tokens,
// and config files that pass `iop check`.
//
// It is a Go module of its own so that iop's go.mod does not take the
// Kubernetes modules; package deploy of iop runs its tests (go test in
// this directory) under make test.
package check
