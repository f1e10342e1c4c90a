// Package deploy holds the files people deploy iop with — systemd units
// (systemd/), a container image (Dockerfile at the repository's root) and
// a compose file (compose.yaml) — and the tests that check them: the units
// with systemd-analyze verify, the Dockerfile and the compose file with
// their own parsers. It has no code.
package deploy
