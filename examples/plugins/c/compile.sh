#!/bin/sh
# Build a C example plugin: examples/plugins/c/compile.sh OUT.wasm SOURCE.c [LIBS...]
# Each examples/plugins/NAME-c/build.sh calls it with its own source (it is
# not named build.sh: a directory with one is an example); the
# headers here (agenthost.h, json.h, ...) are found by its #include lines.
#
# Needs clang, lld and the WASI sysroot (Debian/Ubuntu:
#   apt-get install -y clang lld wasi-libc libclang-rt-14-dev-wasm32).
# Set CC to use another clang.
#
#   --target=wasm32-wasi     WASI preview 1, which the host links
#   -mexec-model=reactor     a library, not a command: no main; wasi-libc's
#                            _initialize runs its constructors, and the
#                            exports can be called any number of times
#   -Wl,--strip-all          smaller file (export names are kept)
set -eu
if [ $# -lt 2 ]; then
	echo "usage: $0 OUT.wasm SOURCE.c [LIBS...]" >&2
	exit 2
fi
out=$1
src=$2
shift 2
CC=${CC:-clang}
if ! command -v "$CC" >/dev/null 2>&1; then
	echo "$0: $CC not found: apt-get install -y clang lld wasi-libc libclang-rt-14-dev-wasm32" >&2
	exit 1
fi
exec "$CC" --target=wasm32-wasi -mexec-model=reactor -O2 -std=c11 -Wall -Wextra -Werror \
	-Wl,--strip-all \
	-o "$out" "$src" "$@"
