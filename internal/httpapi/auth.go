package httpapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"

	"github.com/agenthost/agenthost/loop"
)

// Authenticator maps a bearer token to the tenant it belongs to.
// Implementations are safe for concurrent use.
type Authenticator interface {
	// Authenticate returns the token's tenant, or false for a token no
	// tenant has.
	Authenticate(token string) (tenant string, ok bool)
}

// TokenAuthenticator authenticates bearer tokens against SHA-256 hashes
// configured per tenant: the config never holds a token in clear. It
// hashes the token it is given and compares that hash with every
// configured one in constant time, so neither the answer's timing nor an
// early exit tells which hash came close.
//
// TokenAuthenticator is immutable and safe for concurrent use.
type TokenAuthenticator struct {
	entries []tokenEntry
}

type tokenEntry struct {
	hash   [sha256.Size]byte
	tenant string
}

var _ Authenticator = (*TokenAuthenticator)(nil)

// NewTokenAuthenticator takes, for each tenant ID, the hex SHA-256 hashes
// of its tokens (as `printf %s TOKEN | sha256sum` prints them). A hash
// that is not 64 hex digits, a tenant ID outside the ID grammar, or one
// hash given to two tenants is an error.
func NewTokenAuthenticator(hashesByTenant map[string][]string) (*TokenAuthenticator, error) {
	tenants := make([]string, 0, len(hashesByTenant))
	for t := range hashesByTenant {
		tenants = append(tenants, t)
	}
	sort.Strings(tenants)
	owner := map[[sha256.Size]byte]string{}
	a := &TokenAuthenticator{}
	for _, tenant := range tenants {
		if err := loop.CheckID("tenant", tenant); err != nil {
			return nil, fmt.Errorf("httpapi: token hashes: %w", err)
		}
		for i, h := range hashesByTenant[tenant] {
			raw, err := hex.DecodeString(strings.TrimSpace(h))
			if err != nil || len(raw) != sha256.Size {
				return nil, fmt.Errorf("httpapi: tenant %s: token hash %d is not a SHA-256 hash in hex (64 hex digits); make one with: printf %%s TOKEN | sha256sum", tenant, i+1)
			}
			var sum [sha256.Size]byte
			copy(sum[:], raw)
			if other, dup := owner[sum]; dup {
				return nil, fmt.Errorf("httpapi: tenant %s: token hash %d is also a token hash of tenant %s; a token must belong to one tenant", tenant, i+1, other)
			}
			owner[sum] = tenant
			a.entries = append(a.entries, tokenEntry{hash: sum, tenant: tenant})
		}
	}
	return a, nil
}

// Len is the number of token hashes a holds.
func (a *TokenAuthenticator) Len() int { return len(a.entries) }

// HashToken returns the hex SHA-256 hash of a token, the form the config
// holds.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// Authenticate implements Authenticator.
func (a *TokenAuthenticator) Authenticate(token string) (string, bool) {
	if token == "" {
		return "", false
	}
	sum := sha256.Sum256([]byte(token))
	match := -1
	for i := range a.entries {
		// Compare with every entry, whatever matched before.
		if subtle.ConstantTimeCompare(sum[:], a.entries[i].hash[:]) == 1 {
			match = i
		}
	}
	if match < 0 {
		return "", false
	}
	return a.entries[match].tenant, true
}
