#!/usr/bin/env bash
# Builds a CPU-only Ollama server for the real-server tests, once per machine.
#
#   test/ollama/build.sh            builds (if missing) and prints the binary's path on stdout
#
# The binary is cached outside the tree, at
#   ${IOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/iop}/ollama-$OLLAMA_VERSION/ollama
# so only a new machine pays the build (a few minutes on 2 cores). Ollama is a
# Go module; `go install github.com/ollama/ollama@VERSION` builds it with cgo
# (llama.cpp and ggml, CPU backend) once three things the module zip leaves out
# are supplied: nlohmann/json.hpp and stb/stb_image.h from Debian's
# nlohmann-json3-dev and libstb-dev (installed here when missing; needs root),
# and miniaudio/miniaudio.h, for which a no-audio stand-in is written next to
# the binary (audio input is not needed by the tests) and put in CGO_CPPFLAGS.
#
# Idempotent and safe to interrupt: it builds into a temporary folder and
# renames the binary into place only when `go install` succeeded; an
# interrupted build resumes from Go's build cache. Progress goes to stderr.
set -euo pipefail

VERSION=${OLLAMA_VERSION:-v0.17.4}
CACHE=${IOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/iop}
DIR="$CACHE/ollama-$VERSION"
BIN="$DIR/ollama"
GO=${GO:-go}

say() { echo "ollama build: $*" >&2; }

if [ -x "$BIN" ]; then
	echo "$BIN"
	exit 0
fi

if [ ! -f /usr/include/nlohmann/json.hpp ] || [ ! -f /usr/include/stb/stb_image.h ]; then
	say "installing Debian's nlohmann-json3-dev and libstb-dev (C++ headers the Go module zip of Ollama leaves out)"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nlohmann-json3-dev libstb-dev >/dev/null
fi
command -v g++ >/dev/null || { say "a C/C++ compiler (gcc, g++) is needed"; exit 1; }

mkdir -p "$DIR"
TMP=$(mktemp -d "$DIR/build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# A stand-in for miniaudio.h: the types and functions that llama.cpp's
# tools/mtmd/mtmd-helper.cpp uses, decoding nothing (every audio input is
# refused as undecodable). Ollama's multimodal audio input is not tested here.
# Its folder is the same on every run: CGO_CPPFLAGS is part of Go's build
# cache key, so a build interrupted and run again reuses what was compiled.
INCLUDE="$DIR/include"
mkdir -p "$INCLUDE/miniaudio"
cat >"$INCLUDE/miniaudio/miniaudio.h.tmp" <<'H'
/* No-audio stand-in for miniaudio.h, written by iop's test/ollama/build.sh. */
#ifndef IOP_MINIAUDIO_STUB_H
#define IOP_MINIAUDIO_STUB_H
#include <stddef.h>
#include <stdint.h>
#ifndef MA_API
#define MA_API static
#endif
typedef int ma_result;
typedef uint32_t ma_uint32;
typedef uint64_t ma_uint64;
#define MA_SUCCESS 0
#define MA_ERROR (-1)
typedef enum { ma_format_unknown = 0, ma_format_f32 = 5 } ma_format;
typedef enum { ma_encoding_format_unknown = 0, ma_encoding_format_wav } ma_encoding_format;
typedef struct { ma_format format; ma_uint32 channels; ma_uint32 sampleRate; } ma_decoder_config;
typedef struct { int unused; } ma_decoder;
typedef struct { int unused; } ma_encoder_config;
typedef struct { int unused; } ma_encoder;
MA_API ma_decoder_config ma_decoder_config_init(ma_format f, ma_uint32 ch, ma_uint32 rate) {
	ma_decoder_config c; c.format = f; c.channels = ch; c.sampleRate = rate; return c;
}
MA_API ma_result ma_decoder_init_memory(const void *p, size_t n, const ma_decoder_config *c, ma_decoder *d) {
	(void)p; (void)n; (void)c; (void)d; return MA_ERROR;
}
MA_API ma_result ma_decoder_get_length_in_pcm_frames(ma_decoder *d, ma_uint64 *n) { (void)d; *n = 0; return MA_ERROR; }
MA_API ma_result ma_decoder_read_pcm_frames(ma_decoder *d, void *o, ma_uint64 n, ma_uint64 *r) {
	(void)d; (void)o; (void)n; *r = 0; return MA_ERROR;
}
MA_API ma_result ma_decoder_uninit(ma_decoder *d) { (void)d; return MA_SUCCESS; }
#endif
H
mv -f "$INCLUDE/miniaudio/miniaudio.h.tmp" "$INCLUDE/miniaudio/miniaudio.h"

say "building Ollama $VERSION (CPU only) into $BIN; this takes several minutes on a new machine"
start=$(date +%s)
# CGO_CPPFLAGS: the stand-in's folder. GOFLAGS is replaced so that a caller's
# -mod or -tags settings do not reach Ollama's build. The -X flag sets the
# version /api/version reports (Ollama's release builds set it the same way;
# without it a source build says 0.0.0).
CGO_ENABLED=1 CGO_CPPFLAGS="-I$INCLUDE ${CGO_CPPFLAGS:-}" GOFLAGS=-buildvcs=false GOBIN="$TMP/bin" \
	"$GO" install -ldflags "-X github.com/ollama/ollama/version.Version=${VERSION#v}" \
	"github.com/ollama/ollama@$VERSION" >&2
mv "$TMP/bin/ollama" "$BIN.tmp"
mv -f "$BIN.tmp" "$BIN"
say "built $BIN in $(( $(date +%s) - start ))s"
echo "$BIN"
