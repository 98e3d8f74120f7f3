// Package modelcall is what the example model executors (openai,
// anthropic) share, in plain Go so that its tests run on the host: the
// config keys every one of them reads, and one model call, sent through
// agenthost_http or, streaming, through agenthost_http_open, _read and
// _close, with the answer's pieces emitted as model_delta events as they
// arrive (docs/ABI.md). Package guest gives the plugins the Host to call
// it with; each provider's package gives the API: how its answers and
// errors read.
package modelcall

import (
	"fmt"
	"strconv"
	"strings"
)

// Config keys, in lower case: the operator's YAML loader (viper)
// lowercases every key.
const (
	KeyBaseURL     = "base_url"
	KeyModel       = "model"
	KeyAPIKey      = "api_key"
	KeyTemperature = "temperature"
	KeyMaxTokens   = "max_tokens"
	KeyTimeoutMS   = "timeout_ms"
	KeyStream      = "stream"
)

// Config is the configuration every example model executor takes.
type Config struct {
	BaseURL     string   // the API's base URL, without a trailing /
	Model       string   // the model's name
	APIKey      string   // sent the way the API takes it, when set
	Temperature *float64 // sent when set
	MaxTokens   int      // 0: not set
	TimeoutMS   int64    // 0: the host's limit
	// Stream asks for the answer as a stream of events, read as it
	// arrives; false waits for the whole answer (agenthost_http).
	Stream bool
}

// ConfigSpec says how one plugin reads the shared keys.
type ConfigSpec struct {
	// Plugin names the plugin in errors, such as "openai".
	Plugin string
	// DefaultBaseURL is base_url when the config has none; "" makes
	// base_url required.
	DefaultBaseURL string
	// BaseURLExample and ModelExample finish the sentences that say what
	// to set a missing base_url and model to: "such as …".
	BaseURLExample, ModelExample string
}

// ParseConfig reads the shared keys through get (the plugin passes
// Extism's config_get). model is required, and base_url unless the spec
// has a default; stream is true unless set to false. Each problem names
// its key, says what is wrong and what to set instead; the plugin adds
// its own keys' problems and reports them all with Err.
func ParseConfig(get func(string) (string, bool), spec ConfigSpec) (Config, []string) {
	c := Config{Stream: true}
	var problems []string
	val := func(k string) string { s, _ := get(k); return strings.TrimSpace(s) }
	c.BaseURL = strings.TrimRight(val(KeyBaseURL), "/")
	switch {
	case c.BaseURL == "" && spec.DefaultBaseURL != "":
		c.BaseURL = spec.DefaultBaseURL
	case c.BaseURL == "":
		problems = append(problems, "base_url is missing: set it to the API's base URL, such as "+spec.BaseURLExample)
	case !strings.HasPrefix(c.BaseURL, "http://") && !strings.HasPrefix(c.BaseURL, "https://"):
		problems = append(problems, fmt.Sprintf("base_url %q is not an http:// or https:// URL", c.BaseURL))
	}
	if c.Model = val(KeyModel); c.Model == "" {
		problems = append(problems, "model is missing: set it to the model's name, such as "+spec.ModelExample)
	}
	c.APIKey = val(KeyAPIKey)
	if s := val(KeyTemperature); s != "" {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || f < 0 {
			problems = append(problems, fmt.Sprintf("temperature %q is not a number of 0 or more", s))
		} else {
			c.Temperature = &f
		}
	}
	if s := val(KeyMaxTokens); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			problems = append(problems, fmt.Sprintf("max_tokens %q is not a whole number above 0", s))
		} else {
			c.MaxTokens = n
		}
	}
	if s := val(KeyTimeoutMS); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			problems = append(problems, fmt.Sprintf("timeout_ms %q is not a whole number above 0", s))
		} else {
			c.TimeoutMS = n
		}
	}
	if s := val(KeyStream); s != "" {
		b, err := strconv.ParseBool(s)
		if err != nil {
			problems = append(problems, fmt.Sprintf("stream %q is not true or false", s))
		} else {
			c.Stream = b
		}
	}
	return c, problems
}

// Err is the error for a config's problems, or nil for none:
// "PLUGIN: config: PROBLEM; PROBLEM".
func Err(plugin string, problems []string) error {
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%s: config: %s", plugin, strings.Join(problems, "; "))
}
