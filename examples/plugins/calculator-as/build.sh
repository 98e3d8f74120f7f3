#!/bin/sh
# Build the AssemblyScript calculator plugin: examples/plugins/calculator-as/build.sh OUT.wasm
#
# Needs node (16 or later) and npm (Debian/Ubuntu: apt-get install -y nodejs npm).
# The compiler (assemblyscript) and Extism's AssemblyScript PDK
# (@extism/as-pdk) come from npm, at the versions package-lock.json pins:
# the first build, and the first after package-lock.json changes, runs
# `npm ci` into node_modules/ here (it needs the npm registry, or npm's
# cache); every other build runs offline.
#
#   --use abort=calculator/abort   AssemblyScript's default abort is an
#                                  import, env.abort, and the host refuses
#                                  any env import: calculator.ts has its own
#   -O3                            optimise for speed (binaryen)
#   the default runtime            (incremental GC): the host keeps an
#                                  instance for many calls, so memory must
#                                  be freed ("--runtime stub" never frees)
set -eu
if [ $# -ne 1 ]; then
	echo "usage: $0 OUT.wasm" >&2
	exit 2
fi
out=$1
case $out in
/*) ;;
*) out=$(pwd)/$out ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
for tool in node npm; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "$0: $tool not found: apt-get install -y nodejs npm" >&2
		exit 1
	fi
done
if ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 16 ? 0 : 1)'; then
	echo "$0: node $(node --version) is too old: AssemblyScript 0.27 needs node 16 or later" >&2
	exit 1
fi
cd "$here"
# One build at a time in this directory: npm ci replaces node_modules/,
# which a concurrent build would be reading (test binaries build in
# parallel).
if command -v flock >/dev/null 2>&1; then
	exec 9>.build.lock
	flock 9
fi
# node_modules/ is current when it was installed from this package-lock.json.
stamp=node_modules/.installed-package-lock.json
if ! cmp -s package-lock.json "$stamp" 2>/dev/null; then
	npm ci --no-audit --no-fund --prefer-offline >&2
	cp package-lock.json "$stamp"
fi
exec npx --no -- asc calculator.ts -O3 --use abort=calculator/abort -o "$out"
