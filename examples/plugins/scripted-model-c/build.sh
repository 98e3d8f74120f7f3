#!/bin/sh
# Build the C scripted-model plugin: examples/plugins/scripted-model-c/build.sh OUT.wasm
# (examples/plugins/c/compile.sh says what it needs and how it compiles).
set -eu
if [ $# -ne 1 ]; then
	echo "usage: $0 OUT.wasm" >&2
	exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
exec sh "$here/../c/compile.sh" "$1" "$here/scripted_model.c"
