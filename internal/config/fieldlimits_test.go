package config

import (
	"strings"
	"testing"
)

// TestFieldLimitKeys reads http.max_input_bytes, http.max_metadata_bytes
// and http.max_reason_bytes: absent, 0 (the server's defaults); set, from
// the file or the environment; past the request body cap, a problem that
// names the key and the range.
func TestFieldLimitKeys(t *testing.T) {
	cfg, err := parse(t, minimal)
	if err != nil {
		t.Fatal(err)
	}
	if h := cfg.HTTP; h.MaxInputBytes != 0 || h.MaxMetadataBytes != 0 || h.MaxReasonBytes != 0 {
		t.Errorf("absent field limits read as %d, %d, %d; want 0 (the server's defaults)", h.MaxInputBytes, h.MaxMetadataBytes, h.MaxReasonBytes)
	}

	_, err = parse(t, minimal+`
http:
  max_input_bytes: 2000000
  max_metadata_bytes: -1
  max_reason_bytes: lots
`)
	got := strings.Join(problems(t, err), "\n")
	for _, want := range []string{
		"http.max_input_bytes: 2000000 is out of range: want 0 to 1048576",
		"http.max_metadata_bytes: -1 is out of range",
		"http.max_reason_bytes: want an integer",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("no problem %q in:\n%s", want, got)
		}
	}

	t.Setenv("AGENTHOST_HTTP_MAX_REASON_BYTES", "100")
	cfg, err = parse(t, minimal+`
http:
  max_input_bytes: 1000
  max_metadata_bytes: 500
`)
	if err != nil {
		t.Fatal(err)
	}
	if h := cfg.HTTP; h.MaxInputBytes != 1000 || h.MaxMetadataBytes != 500 || h.MaxReasonBytes != 100 {
		t.Errorf("field limits read as %d, %d, %d; want 1000, 500, 100", h.MaxInputBytes, h.MaxMetadataBytes, h.MaxReasonBytes)
	}
}
