// calculator-as: the calculator example in AssemblyScript, on Extism's
// AssemblyScript PDK (@extism/as-pdk). The tool "calculate" evaluates an
// arithmetic expression with the grammar, results and error messages of
// the Go calculator (examples/plugins/calculator/expr); the examples' tests
// hold the Go, C and AssemblyScript calculators to one table. A malformed
// expression or a division by zero is a tool result with is_error true,
// never a trap.
//
// Build: examples/plugins/calculator-as/build.sh calculator-as.wasm
// (asc ... --use abort=calculator/abort: see abort below).

import { Host, Memory } from "@extism/as-pdk";
import { error_set } from "@extism/as-pdk/lib/env";

import { evaluate } from "./expr";
import { Kind, Value, isNull, parse, quote } from "./json";
import { format } from "./number";

// ---- the ABI marker ------------------------------------------------------

// The host reads it from the exports and never calls it.
export function agenthost_abi_v1(): void {}

// ---- abort ---------------------------------------------------------------

let aborting = false;

// abort replaces AssemblyScript's default, which imports env.abort: a
// module that imports it is refused by the host (only extism:host/env,
// WASI and the agenthost host functions are linked). The compiler calls it
// on a failed assertion, an index out of range or running out of memory:
// a bug, not bad input. It sets the Extism error, so the host's error says
// what happened, and traps; the host discards the instance.
function abort(message: string | null, fileName: string | null, line: u32, column: u32): void {
  if (!aborting) {
    aborting = true; // an abort while reporting one (out of memory) just traps
    const msg =
      "calculator-as: abort: " +
      (message === null ? "" : message) +
      " at " +
      (fileName === null ? "?" : fileName) +
      ":" +
      line.toString() +
      ":" +
      column.toString();
    error_set(Memory.allocateString(msg).offset);
  }
  unreachable();
}

// ---- replies -------------------------------------------------------------

// reply sets the call's output. (The PDK's Host.outputString allocates
// s.length bytes, UTF-16 code units, not UTF-8 bytes: encode first.)
function reply(json: string): i32 {
  Host.output(Uint8Array.wrap(String.UTF8.encode(json)));
  return 0;
}

// fail is a protocol error: the host fails the call (plugin_protocol) with
// this message.
function fail(message: string): i32 {
  error_set(Memory.allocateString(message).offset);
  return 1;
}

function toolResult(content: string, isError: bool): i32 {
  return reply('{"state":"done","outcome":{"content":' + quote(content) + ',"is_error":' + (isError ? "true" : "false") + "}}");
}

function failed(message: string): i32 {
  return reply('{"state":"failed","error":{"message":' + quote(message) + ',"retriable":false}}');
}

// ---- input ---------------------------------------------------------------

let inputStatus: i32 = 0;

// effectInput reads the input of start, poll, attach or cancel and checks
// that it names an effect attempt. It returns the effect, or null with the
// status to return in inputStatus.
function effectInput(): Value | null {
  const input = parse(Host.input());
  if (input === null) {
    inputStatus = fail("the input is not an effect input: it is not JSON");
    return null;
  }
  const effect = input.get("effect");
  if (effect !== null) {
    const id = effect.get("id");
    const attempt = effect.get("attempt");
    if (
      id !== null && id.kind == Kind.String && id.bytes.length > 0 &&
      attempt !== null && attempt.kind == Kind.Number && attempt.isInt && attempt.num >= 1
    ) {
      return effect;
    }
  }
  inputStatus = fail("the input names no effect attempt: effect.id and effect.attempt (from 1) are required");
  return null;
}

// text is a member's string value, or "" when it is missing or not a string.
function text(v: Value | null): string {
  if (v === null) return "";
  const s = v.text();
  return s === null ? "" : s;
}

// ---- the exports ---------------------------------------------------------

const DESCRIBE =
  '{"abi":1,"name":"calculator-as","version":"1.0.0","role":"executor","effects":["tool"],' +
  '"tools":[{"name":"calculate",' +
  '"description":"Evaluate an arithmetic expression: + - * / % ^, parentheses, unary minus and decimals. Example: (2+3)*4",' +
  '"input_schema":{"type":"object","properties":{"expression":{"type":"string","description":"the expression, e.g. (2+3)*4"}},"required":["expression"]},' +
  '"idempotent":true,"approval":"never"}],' +
  '"attach":false}';

export function describe(): i32 {
  if (parse(Host.input()) === null) return fail("describe: the input is not JSON");
  return reply(DESCRIBE);
}

const NOT_AN_OBJECT = 'error: the arguments must be {"expression": "..."}: they are not a JSON object';

export function start(): i32 {
  const effect = effectInput();
  if (effect === null) return inputStatus;

  const kind = text(effect.get("kind"));
  const tool = text(effect.get("tool"));
  if (kind != "tool" || tool != "calculate") {
    return failed("calculator: no tool " + quote(tool) + " of kind " + quote(kind) + ' here; this plugin offers the tool "calculate"');
  }

  // request.arguments.expression; a missing or null request or arguments
  // is {}.
  const request = effect.get("request");
  let args: Value | null = null;
  if (!isNull(request)) {
    if (request!.kind != Kind.Object) return toolResult(NOT_AN_OBJECT, true);
    args = request!.get("arguments");
  }
  if (!isNull(args) && args!.kind != Kind.Object) return toolResult(NOT_AN_OBJECT, true);
  let expression: Value | null = null;
  if (!isNull(args)) expression = args!.get("expression");
  if (isNull(expression)) {
    return toolResult('error: the argument "expression" is missing; pass {"expression": "(2+3)*4"}', true);
  }
  if (expression!.kind != Kind.String) {
    return toolResult('error: the arguments must be {"expression": "..."}: expression is not a string', true);
  }

  const r = evaluate(expression!.bytes);
  if (r.err.length != 0) return toolResult("error: " + r.err, true);
  return toolResult(format(r.value), false);
}

// poll and attach: the calculator never answers pending, so it holds no
// record of any attempt.
function noRecord(): i32 {
  if (effectInput() === null) return inputStatus;
  return reply('{"state":"unknown"}');
}

export function poll(): i32 {
  return noRecord();
}

export function attach(): i32 {
  return noRecord();
}

export function cancel(): i32 {
  if (effectInput() === null) return inputStatus;
  return reply('{"state":"cancelled"}');
}
