#!/bin/sh
# Build the plugin: ./build.sh [OUT.wasm] (default __NAME__.wasm).
#
# Needs node (18 or later) and npm (Debian/Ubuntu: apt-get install -y nodejs npm).
# The compiler (assemblyscript) and Extism's AssemblyScript PDK
# (@extism/as-pdk) come from npm, at the versions package-lock.json pins:
# the first build, and the first after package-lock.json changes, runs
# `npm ci` into node_modules/ (it needs the npm registry, or npm's cache);
# every other build runs offline.
#
#   --use abort=plugin/abort   AssemblyScript's default abort is an import,
#                              env.abort, which the host refuses: plugin.ts
#                              has its own
#   -O3                        optimise for speed (binaryen)
#   the default runtime        (incremental GC): the host keeps an instance
#                              for many calls, so memory must be freed
#                              ("--runtime stub" never frees)
set -eu
cd "$(dirname "$0")"
out=${1:-__NAME__.wasm}
for tool in node npm; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "$0: $tool not found: apt-get install -y nodejs npm" >&2
		exit 1
	fi
done
# node_modules/ is current when it was installed from this package-lock.json.
stamp=node_modules/.installed-package-lock.json
if ! cmp -s package-lock.json "$stamp" 2>/dev/null; then
	npm ci --no-audit --no-fund --prefer-offline >&2
	cp package-lock.json "$stamp"
fi
exec npx --no -- asc plugin.ts -O3 --use abort=plugin/abort -o "$out"
