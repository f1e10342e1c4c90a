#!/usr/bin/env bash
# Builds the peer gateways of `make bench-peers` (Olla and Bifrost) from
# source snapshots kept outside the tree, and prints the `iop bench --peers`
# flags naming them. It fetches no source: a peer whose snapshot is missing
# is left out (a line on stderr says how to put it there).
#
#   test/peers/build.sh     builds what is missing, prints e.g.
#                           --olla DIR/bin/olla --olla-dir DIR --bifrost DIR2/bin/bifrost-http
#
# Snapshots live at ${IOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/iop}/peers/<name>-<commit>/,
# the source tree at that commit (its root holds go.mod). To put one there,
# on a machine with the repository (a clone, or a mirror copied over):
#
#   C=~/.cache/iop/peers/olla-$OLLA_COMMIT; mkdir -p $C
#   git -C olla archive $OLLA_COMMIT -- . ':(exclude)docs/media' | tar -x -C $C
#   C=~/.cache/iop/peers/bifrost-$BIFROST_COMMIT; mkdir -p $C
#   git -C bifrost archive $BIFROST_COMMIT -- . ':(exclude)docs' ':(exclude)ui' | tar -x -C $C
#
# (github.com/thushan/olla; github.com/maximhq/bifrost. Olla's docs/media and Bifrost's docs hold
# large media and its ui is a Next.js app the gateway only embeds, so they
# are left out; a placeholder ui folder is written, as Bifrost's own
# `make dev` does.) The build uses the Go module cache, or the module proxy
# when a module is missing from it; binaries go to <snapshot>/bin/.
set -euo pipefail

OLLA_COMMIT=${OLLA_COMMIT:?set OLLA_COMMIT}
BIFROST_COMMIT=${BIFROST_COMMIT:?set BIFROST_COMMIT}
CACHE=${IOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/iop}/peers
GO=${GO:-go}

say() { echo "peers build: $*" >&2; }
flags=()

# olla: its main package is the module root.
DIR="$CACHE/olla-$OLLA_COMMIT"
if [ -x "$DIR/bin/olla" ] || { [ -f "$DIR/go.mod" ] && say "building Olla $OLLA_COMMIT" && (cd "$DIR" && "$GO" build -trimpath -o bin/olla.tmp . && mv bin/olla.tmp bin/olla) >&2; }; then
	flags+=(--olla "$DIR/bin/olla" --olla-dir "$DIR")
else
	say "no Olla snapshot at $DIR (or its build failed): Olla is left out; see the top of $0"
fi

# bifrost: the gateway is transports/bifrost-http (its own module, with cgo
# for SQLite); it embeds transports/bifrost-http/ui. Its go.mod requires
# core, framework and plugins at released versions that need not match the
# snapshot's transports: a go.work over the snapshot's own modules builds
# them together, as Bifrost's `make build LOCAL=1` (setup-workspace) does.
DIR="$CACHE/bifrost-$BIFROST_COMMIT"
if [ -x "$DIR/bin/bifrost-http" ] || { [ -f "$DIR/transports/go.mod" ] && say "building Bifrost $BIFROST_COMMIT (several minutes: SQLite and many modules)" &&
	mkdir -p "$DIR/transports/bifrost-http/ui" && touch "$DIR/transports/bifrost-http/ui/.tmp" &&
	(cd "$DIR" && rm -f go.work go.work.sum && "$GO" work init ./core ./framework ./transports &&
		for p in plugins/*/; do if [ -f "$p/go.mod" ]; then "$GO" work use "./$p"; fi; done) &&
	(cd "$DIR/transports" && CGO_ENABLED=1 "$GO" build -trimpath -o ../bin/bifrost-http.tmp ./bifrost-http && mv ../bin/bifrost-http.tmp ../bin/bifrost-http) >&2; }; then
	flags+=(--bifrost "$DIR/bin/bifrost-http")
else
	say "no Bifrost snapshot at $DIR (or its build failed): Bifrost is left out; see the top of $0"
fi
echo "${flags[@]}"
