// __NAME__: an agenthost tool plugin in AssemblyScript (ABI v1,
// docs/ABI.md), on Extism's AssemblyScript PDK (@extism/as-pdk). It offers
// the tool word_count, which counts the words of a text. Bad arguments
// are a tool result with is_error true, which the model reads and can
// correct: never a trap, never a failed effect.
//
// Build:  ./build.sh     (npm ci the first time, then asc ... --use abort=plugin/abort)
// Check:  ./verify.sh    (agenthost plugin verify __NAME__.wasm, and a call)

import { Host, LogLevel, Memory } from "@extism/as-pdk";
import { error_set, free } from "@extism/as-pdk/lib/env";

import { Kind, Value, isNull, parse, quote } from "./json";

const TOOL = "word_count";

// ---- the ABI marker --------------------------------------------------------

// The host reads it from the exports and never calls it.
export function agenthost_abi_v1(): void {}

// ---- abort -----------------------------------------------------------------

let aborting = false;

// abort replaces AssemblyScript's default, which imports env.abort: the
// host refuses a module that imports it (only extism:host/env, WASI and
// the agenthost host functions are linked), so build.sh passes
// --use abort=plugin/abort. The compiler calls it on a failed assertion,
// an index out of range or running out of memory: a bug, not bad input. It
// sets the Extism error, so the host's error says what happened, and
// traps; the host discards the instance.
function abort(message: string | null, fileName: string | null, line: u32, column: u32): void {
  if (!aborting) {
    aborting = true; // an abort while reporting one (out of memory) just traps
    const msg =
      "__NAME__: abort: " +
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

// ---- host functions ----------------------------------------------------------

// agenthost_emit (extism:host/user): (i64) -> i64, an offset in and a
// status out. The other agenthost_* functions are declared the same way,
// with the wasm types of docs/ABI.md, "Host functions".
@external("extism:host/user", "agenthost_emit")
declare function agenthostEmit(event: u64): u64;

// progress puts a progress event on the Run's event stream (`agenthost
// plugin call` prints it); a failure to emit changes nothing.
function progress(message: string): void {
  const m = Memory.allocateString('{"type":"progress","message":' + quote(message) + "}");
  agenthostEmit(m.offset);
  free(m.offset);
}

// ---- replies -----------------------------------------------------------------

// reply sets the call's output to the UTF-8 bytes of json. Do not use the
// PDK's Host.outputString: it sizes the output by s.length, in UTF-16 code
// units, so a reply with any non-ASCII character would come out corrupted.
function reply(json: string): i32 {
  Host.output(Uint8Array.wrap(String.UTF8.encode(json)));
  return 0;
}

// fail is a protocol error: the host fails the call (plugin_protocol) with
// this message. It is for input that is not an ABI message at all; bad
// tool arguments are a tool result with is_error.
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

// ---- input -------------------------------------------------------------------

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

function kindName(v: Value): string {
  if (v.kind == Kind.Null) return "null";
  if (v.kind == Kind.Bool) return "a boolean";
  if (v.kind == Kind.Number) return "a number";
  if (v.kind == Kind.Array) return "an array";
  if (v.kind == Kind.Object) return "an object";
  return "a string";
}

// countWords counts the runs of bytes between ASCII white space (space,
// tab, line feed, carriage return, form feed, vertical tab) in UTF-8
// text: "héllo wörld" is two words.
function countWords(b: Uint8Array): i32 {
  let n = 0;
  let inWord = false;
  for (let i = 0; i < b.length; i++) {
    const c = b[i];
    if (c == 0x20 || (c >= 0x09 && c <= 0x0d)) {
      inWord = false;
    } else {
      if (!inWord) n++;
      inWord = true;
    }
  }
  return n;
}

// ---- the exports -------------------------------------------------------------

const DESCRIBE =
  '{"abi":1,"name":"__NAME__","version":"0.1.0","role":"executor","effects":["tool"],' +
  '"tools":[{"name":"word_count",' +
  '"description":"Count the words of a text: runs of characters between spaces, tabs and line breaks. Example: {\\"text\\": \\"one two three\\"} gives 3",' +
  '"input_schema":{"type":"object","properties":{"text":{"type":"string","description":"the text whose words to count","examples":["one two three"]}},"required":["text"]},' +
  '"idempotent":true,"approval":"never"}],' +
  '"attach":false}';

export function describe(): i32 {
  if (parse(Host.input()) === null) return fail("describe: the input is not JSON");
  return reply(DESCRIBE);
}

const NOT_AN_OBJECT = 'error: the arguments must be a JSON object, {"text": "..."}';

export function start(): i32 {
  const effect = effectInput();
  if (effect === null) return inputStatus;

  const kind = text(effect.get("kind"));
  const tool = text(effect.get("tool"));
  if (kind != "tool" || tool != TOOL) {
    return failed("__NAME__: no tool " + quote(tool) + " of kind " + quote(kind) + ' here; this plugin offers the tool "' + TOOL + '"');
  }

  // request.arguments.text; a missing or null request or arguments is {}.
  const request = effect.get("request");
  let args: Value | null = null;
  if (!isNull(request)) {
    if (request!.kind != Kind.Object) return toolResult(NOT_AN_OBJECT, true);
    args = request!.get("arguments");
  }
  if (!isNull(args) && args!.kind != Kind.Object) return toolResult(NOT_AN_OBJECT, true);
  let t: Value | null = null;
  if (!isNull(args)) t = args!.get("text");
  if (t === null) {
    return toolResult('error: the argument "text" is missing; pass {"text": "one two three"}', true);
  }
  if (t.kind != Kind.String) {
    return toolResult('error: the argument "text" must be a string, not ' + kindName(t), true);
  }
  Host.log(LogLevel.Info, "word_count: " + t.bytes.length.toString() + " bytes of text");
  const count = countWords(t.bytes).toString();
  progress("counted: " + count + " words");
  return toolResult(count, false);
}

// poll and attach: the tool never answers pending, so it holds no record
// of any attempt. A tool that runs long answers pending from start, keeps
// its state in the host KV (agenthost_kv_set), and answers here from it.
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
