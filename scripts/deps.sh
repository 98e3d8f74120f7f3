#!/bin/sh
# scripts/deps.sh: make sure the tools `make test` needs are on this
# machine; `make test` runs it first (as `make deps`). `scripts/deps.sh c`
# checks only the C toolchain, which `make run` needs for the C builds of
# the example plugins it loads (as `make deps-c`).
#
# Each line of REQUIRED below is a file that must exist (a glob pattern
# that must match) and the Debian package that provides it. When every file is there, the script does
# nothing and takes a few milliseconds. When some are missing:
#   - as root on Debian or Ubuntu, it installs their packages with apt-get;
#   - anywhere else, it prints one line with the command that installs
#     them and exits 1, before any test runs.
# Run it again at any time: it is idempotent.
#
# What it installs today: clang, lld, wasi-libc and
# libclang-rt-14-dev-wasm32, which build the C example plugin
# (examples/plugins/calculator-c) that the tests verify; nodejs and npm,
# which build the AssemblyScript one (examples/plugins/calculator-as: its
# build.sh installs the compiler and Extism's PDK from package-lock.json
# with npm ci, into its node_modules/, the first time it runs), the web
# console's browser test (internal/console/testdata/e2e:
# playwright-core, by npm ci the first time), and the lint of the API's
# OpenAPI document (internal/httpapi/testdata/openapi: @redocly/cli, by
# npm ci the first time); chromium, the browser that the console's
# test drives (Debian's, at /usr/bin/chromium; playwright downloads
# none); and postgresql,
# whose server (initdb, pg_ctl) runs the pgstore tests: internal/pgserver
# starts a throwaway one per test binary, as the postgres user when the
# tests run as root.
set -eu

C_TOOLCHAIN='
/usr/bin/clang clang
/usr/bin/wasm-ld lld
/usr/include/wasm32-wasi/stdio.h wasi-libc
/usr/lib/llvm-14/lib/clang/*/lib/wasi/libclang_rt.builtins-wasm32.a libclang-rt-14-dev-wasm32
'
REQUIRED="$C_TOOLCHAIN"'
/usr/bin/node nodejs
/usr/bin/npm npm
/usr/lib/postgresql/*/bin/initdb postgresql
/usr/bin/chromium chromium
'
target="make test"
case "${1:-}" in
"") ;;
c)
	REQUIRED=$C_TOOLCHAIN
	target="make run (the C builds of the example plugins)"
	;;
*)
	echo "usage: scripts/deps.sh [c]: every tool make test needs, or with c the C toolchain alone" >&2
	exit 2
	;;
esac

missing=$(printf '%s\n' "$REQUIRED" | while read -r file pkg; do
	[ -n "$file" ] || continue
	# shellcheck disable=SC2086 # unquoted, so that a pattern expands
	set -- $file
	[ -e "$1" ] || echo "$pkg"
done | sort -u | tr '\n' ' ')
missing=${missing% }

[ -z "$missing" ] && exit 0

command="apt-get install -y $missing"
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
	echo "scripts/deps.sh: $target needs $missing; install them (Debian/Ubuntu: sudo apt-get update && sudo $command), then run it again" >&2
	exit 1
fi

echo "scripts/deps.sh: installing $missing (apt-get, as root)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# shellcheck disable=SC2086 # one word a package
apt-get install -y -q $missing
