package loop

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/agenthost/agenthost/plugins/abi"
)

// An agent may declare an output schema (AgentPin.OutputSchema, JSON
// Schema 2020-12): its Runs' final answer must then be one JSON value that
// matches it. The check is the tool arguments' one (arguments.go),
// compiled, bounded and sorted the same way, so it too is a function of
// the schema's bytes and the answer's alone:
//
//   - an answer that passes completes the Run, with the answer's text as
//     the model gave it as the Run's result;
//   - an answer that fails is kept in the transcript, followed by a user
//     message that begins with OutputRetryPrefix and says why (the JSON
//     error, or the sorted problems, bounded) and asks for the JSON value
//     alone; the Run then needs another model step;
//   - when max_steps leaves no step for that, the Run fails as
//     limit_exceeded, and its failure says why the last answer failed.
//
// A model's answer that asks the user a question (await_input) or calls
// tools is not a final answer, and is not checked.

// Bounds of what the output check says.
const (
	// maxOutputProblems is how many of the sorted problems the reason
	// lists; it counts the others.
	maxOutputProblems = 8
	// maxOutputWhy bounds the reason, in bytes.
	maxOutputWhy = 2048
	// maxSchemaQuoted is the largest schema (its compact JSON, in bytes)
	// the message to the model quotes; a larger one is named, not quoted.
	maxSchemaQuoted = 4096
)

// OutputRetryPrefix begins the user message the Loop appends to a Run's
// transcript when the model's final answer fails its agent's output
// schema: a builder or a reader of the transcript tells it apart from a
// person's input by it.
const OutputRetryPrefix = "[agenthost] Your answer was not accepted: "

// answerWords word the problems of a final answer.
var answerWords = valueWords{
	are: "it is", nests: "it nests", notMatch: "it does not match", them: "it", their: "its",
	schema: "the output schema", follows: "the first value", once: "write it once",
	smaller: "answer with a smaller JSON value", shorter: "answer with shorter strings",
}

// CompileOutputSchema compiles an agent's output schema under the rules
// of a tool's input_schema (CompileToolSchema: nothing loaded, bounded),
// or says why it cannot check answers. The config checks an agent's
// schema with it when it loads, so a Run never meets one that does not
// compile.
func CompileOutputSchema(raw json.RawMessage) (*ToolSchema, error) {
	return CompileToolSchema(raw)
}

// CheckAnswer checks a final answer, as the model wrote it, against the
// schema: nil when it is one JSON value (white space around it aside) that
// matches, or an error that says why, deterministic and at most a few KiB.
func (s *ToolSchema) CheckAnswer(content string) error {
	t := bytes.TrimSpace([]byte(content))
	if len(t) == 0 {
		return fmt.Errorf("it is empty, and it must be a JSON value")
	}
	v, shape, rerr := readJSON(t, &answerWords)
	if rerr != nil {
		return fmt.Errorf("%s", truncateText(rerr.Error(), maxOutputWhy))
	}
	leaves, err := s.validate(v, shape, &answerWords)
	if err != nil {
		return fmt.Errorf("%s", truncateText(err.Error(), maxOutputWhy))
	}
	if len(leaves) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString("it does not match the output schema: ")
	for i, l := range leaves {
		if i == maxOutputProblems {
			fmt.Fprintf(&b, "; and %d more problem(s)", len(leaves)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(l.Error())
	}
	return fmt.Errorf("%s", truncateText(b.String(), maxOutputWhy))
}

// checkOutput judges a final answer against the Run's output schema:
// "" when the Run has none or the answer passes, else why it fails;
// broken is set when the schema itself cannot check answers.
func (r *Run) checkOutput(content string) (why string, broken bool) {
	if r.Agent == nil || absentJSON(r.Agent.OutputSchema) {
		return "", false
	}
	s, err := CompileOutputSchema(r.Agent.OutputSchema)
	if err != nil {
		return truncateText(err.Error(), maxOutputWhy), true
	}
	if err := s.CheckAnswer(content); err != nil {
		return err.Error(), false
	}
	return "", false
}

// finalAnswer ends the Run with the model's final answer of step, or,
// when the answer fails the Run's output schema, asks the model again.
func (r *Run) finalAnswer(step int, content string) {
	why, broken := r.checkOutput(content)
	switch {
	case broken:
		r.beginEnd(Verdict{Status: StatusFailed, Failure: &Failure{Class: abi.ClassPluginProtocol,
			Message: truncateText(fmt.Sprintf("agent %s's output_schema cannot check answers (%s); the agent's config must be fixed", r.Agent.Name, why), maxOutputWhy+256)}})
	case why == "":
		r.beginEnd(Verdict{Status: StatusCompleted, Result: content})
	case r.Step >= r.Limits.MaxSteps:
		r.beginEnd(Verdict{Status: StatusFailed, Failure: &Failure{Class: abi.ClassLimitExceeded,
			Message: fmt.Sprintf("max_steps %d reached before an answer that matches the agent's output_schema; the last one (step %d) was refused: %s", r.Limits.MaxSteps, step, why)}})
	default:
		r.Transcript = append(r.Transcript, abi.Message{Role: abi.MessageUser, Content: r.outputRetryMessage(why)})
		r.Effects = nil
	}
}

// outputRetryMessage is the user message that tells the model why its
// answer failed and asks it again: OutputRetryPrefix, the reason, the
// request, and the schema when it is small enough to quote.
func (r *Run) outputRetryMessage(why string) string {
	var b strings.Builder
	b.WriteString(OutputRetryPrefix)
	b.WriteString(why)
	b.WriteString(".\nAnswer again with only one JSON value that matches the output schema: no other text, no code fence.")
	var compact bytes.Buffer
	if err := json.Compact(&compact, r.Agent.OutputSchema); err == nil && compact.Len() <= maxSchemaQuoted {
		b.WriteString("\nThe output schema: ")
		b.Write(compact.Bytes())
	}
	return b.String()
}
