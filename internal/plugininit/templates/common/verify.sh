#!/bin/sh
# ./verify.sh: build the plugin, hold it to the ABI with `agenthost plugin
# verify`, then call its tool with good and bad arguments with `agenthost
# plugin call`. Exits non-zero on the first failure.
#
# AGENTHOST names the agenthost binary (default: agenthost on PATH), and
# AGENTHOST_CACHE_DIR the wazero compilation cache it keeps between runs
# (default: .cache/wazero here), so that each build is compiled once.
set -eu
cd "$(dirname "$0")"
AGENTHOST=${AGENTHOST:-agenthost}
cache=${AGENTHOST_CACHE_DIR:-.cache/wazero}
wasm=__NAME__.wasm
./build.sh "$wasm"
"$AGENTHOST" plugin verify --cache-dir "$cache" "$wasm"
"$AGENTHOST" plugin verify --cache-dir "$cache" "$wasm" --tool word_count --args '{"text":"one two three"}'
"$AGENTHOST" plugin call --cache-dir "$cache" "$wasm" start --tool word_count --input '{"text":"one two three"}'
# Bad arguments are a tool result with "is_error": true, never a trap.
"$AGENTHOST" plugin call --cache-dir "$cache" "$wasm" start --tool word_count --input '{"text":3}'
