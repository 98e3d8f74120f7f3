#!/bin/sh
# ./verify.sh: build the plugin, hold it to the ABI with `agenthost plugin
# verify`, then call its tool with good and bad arguments with `agenthost
# plugin call`. Exits non-zero on the first failure.
#
# AGENTHOST names the agenthost binary (default: agenthost on PATH).
set -eu
cd "$(dirname "$0")"
AGENTHOST=${AGENTHOST:-agenthost}
wasm=__NAME__.wasm
./build.sh "$wasm"
"$AGENTHOST" plugin verify "$wasm"
"$AGENTHOST" plugin verify "$wasm" --tool word_count --args '{"text":"one two three"}'
"$AGENTHOST" plugin call "$wasm" start --tool word_count --input '{"text":"one two three"}'
# Bad arguments are a tool result with "is_error": true, never a trap.
"$AGENTHOST" plugin call "$wasm" start --tool word_count --input '{"text":3}'
