// Package console is agenthost's web console: a few static files (HTML,
// CSS and JavaScript modules, embedded in the binary) that `agenthost
// serve` serves at /console/ on its API listener. In the browser it signs
// in with a tenant's bearer token and uses the HTTP API (package httpapi)
// as that tenant: the Runs and sessions list, a Run's conversation, event
// log, attempts and timeline, live over the event stream, and the actions
// (approve or deny a tool call, answer a question, cancel, start a Run).
//
// Handler serves the files, with a strict Content-Security-Policy (no
// inline script or style, no other origin) and the headers that keep the
// console out of frames, sniffing and Referer headers. The files need no
// build step: testdata/e2e holds the browser test's Node package
// (playwright-core), which cmd/agenthost's TestConsoleInABrowser runs.
//
// How the JavaScript keeps what it shows safe is in the package's
// README.md; why it has no framework and reads the event stream with
// fetch, in RATIONALE.md.
package console
