// Package deploy holds the files people deploy iop with — systemd units
// (systemd/), a container image (Dockerfile at the repository's root), a
// compose file (compose.yaml) and a Helm chart (helm/iop) — and the tests
// that check them: the units with systemd-analyze verify, the Dockerfile
// and the compose file with their own parsers, the chart with helm and
// the Kubernetes API types (the Go module helm/check, whose tests
// TestHelmChart runs). It has no code.
package deploy
