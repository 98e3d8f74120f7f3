#!/bin/sh
# Build the plugin: ./build.sh [OUT.wasm] (default __NAME__.wasm).
#
#   GOOS=wasip1 GOARCH=wasm   WASI preview 1, which the host links
#   -buildmode=c-shared       a reactor: main never runs, and the host calls
#                             the //go:wasmexport functions any number of times
#   -trimpath                 no paths of this machine in the module: the same
#                             sources build the same bytes anywhere
# Needs Go 1.24 or later (//go:wasmexport). The first build fetches
# github.com/extism/go-pdk from the Go module proxy.
set -eu
cd "$(dirname "$0")"
out=${1:-__NAME__.wasm}
GOOS=wasip1 GOARCH=wasm exec go build -trimpath -buildmode=c-shared -o "$out" .
