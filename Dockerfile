# syntax=docker/dockerfile:1
# One image for iop edge, node and sim: a static iop binary on an empty
# base, run as a non-root user. Build from the repository's root:
#   docker build -t iop --build-arg VERSION=$(git describe --tags --always) .
#   docker run --rm iop version
# The command is iop's: `edge --config /etc/iop/edge.yaml` by default;
# `node --config /etc/iop/node.yaml` or `sim ...` run the others
# (compose.yaml runs all three).

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=0.1.0-dev
ARG COMMIT=unknown
ARG DATE=unknown
# CGO off: a static binary (SQLite is modernc.org/sqlite, pure Go).
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT} -X main.date=${DATE}" \
      -o /out/iop ./cmd/iop
# The state directory, owned by the user the image runs as.
RUN mkdir -p /out/var/lib/iop /out/etc/iop && chown 65532:65532 /out/var/lib/iop

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/iop /usr/local/bin/iop
COPY --from=build --chown=65532:65532 /out/var/lib/iop /var/lib/iop
COPY --from=build /out/etc/iop /etc/iop
USER 65532:65532
WORKDIR /var/lib/iop
# 8080: the HTTP API; 7070: the node endpoint.
EXPOSE 8080 7070
# SIGTERM drains (drain_timeout, 30s): give docker stop --time 45.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/iop"]
CMD ["edge", "--config", "/etc/iop/edge.yaml"]
