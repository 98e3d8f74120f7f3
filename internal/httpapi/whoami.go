package httpapi

import "net/http"

// WhoAmIJSON is the answer of GET /v1/whoami: the tenant the bearer token
// maps to, so that a client (the web console) can say whom it acts as.
type WhoAmIJSON struct {
	Tenant string `json:"tenant"`
}

func (s *Server) whoAmI(w http.ResponseWriter, _ *http.Request, tenant string) error {
	writeJSON(w, http.StatusOK, WhoAmIJSON{Tenant: tenant})
	return nil
}
