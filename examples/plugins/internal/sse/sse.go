// Package sse reads a Server-Sent Events body (text/event-stream, as the
// HTML Living Standard defines it) in pieces as they arrive: a piece may
// end anywhere, in the middle of a line or between the CR and the LF of
// a line break. The example model executors read their providers'
// streamed answers with it. It is plain Go, so its tests run on the host.
package sse

import "bytes"

// Event is one event of the stream: its type (the event field; empty
// when the event has none, which the standard calls "message") and its
// data (the data fields' values, joined by "\n").
type Event struct {
	Type string
	Data string
}

// Parser reads an event stream piece by piece. The zero Parser is ready
// at the start of a stream.
type Parser struct {
	line    []byte // the line read so far, without its line break
	skipLF  bool   // the last line ended with CR: an LF next is part of that break
	started bool   // past the start of the stream, where a byte order mark is skipped
	typ     string
	data    []byte
	hasData bool
}

// bom is the UTF-8 byte order mark the standard lets a stream start with.
var bom = []byte("\xef\xbb\xbf")

// Feed reads the next piece of the stream and returns the events it
// completes, in order: an event is complete at the blank line after it.
// What is left of a line or an event waits for the next piece. Comments
// (lines that start with ":", such as keep-alives) and the fields id and
// retry are skipped, as are fields the standard does not define.
func (p *Parser) Feed(b []byte) []Event {
	var out []Event
	for len(b) > 0 {
		if p.skipLF {
			p.skipLF = false
			if b[0] == '\n' {
				b = b[1:]
				continue
			}
		}
		i := bytes.IndexAny(b, "\r\n")
		if i < 0 {
			p.line = append(p.line, b...)
			break
		}
		p.line = append(p.line, b[:i]...)
		p.skipLF = b[i] == '\r'
		b = b[i+1:]
		if ev, ok := p.endLine(); ok {
			out = append(out, ev)
		}
	}
	return out
}

// endLine processes the line in p.line, and returns the event a blank
// line completes.
func (p *Parser) endLine() (Event, bool) {
	line := p.line
	p.line = p.line[:0]
	if !p.started {
		p.started = true
		line = bytes.TrimPrefix(line, bom)
	}
	if len(line) == 0 {
		return p.dispatch()
	}
	if line[0] == ':' {
		return Event{}, false
	}
	field, value := line, []byte(nil)
	if i := bytes.IndexByte(line, ':'); i >= 0 {
		field, value = line[:i], line[i+1:]
		value = bytes.TrimPrefix(value, []byte(" "))
	}
	switch string(field) {
	case "event":
		p.typ = string(value)
	case "data":
		if p.hasData {
			p.data = append(p.data, '\n')
		}
		p.data = append(p.data, value...)
		p.hasData = true
	}
	return Event{}, false
}

// dispatch ends the event being read: an event with no data line is not
// one (the standard drops it); its type is forgotten either way.
func (p *Parser) dispatch() (Event, bool) {
	ev := Event{Type: p.typ, Data: string(p.data)}
	ok := p.hasData
	p.typ, p.data, p.hasData = "", p.data[:0], false
	return ev, ok
}
