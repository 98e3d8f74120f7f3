package httpapi

import (
	"errors"
	"maps"
)

// Tenants is what the server holds of the tenants: whose a token is, and
// each tenant's quotas and limits. New takes it from Config (Auth, Quotas,
// Limits); SetTenants replaces it whole, at a config reload.
type Tenants struct {
	Auth Authenticator
	// Quotas by tenant ID; a tenant without an entry has no quota.
	Quotas map[string]Quota
	// Limits by tenant ID; a tenant without an entry has none.
	Limits map[string]TenantLimits
}

// tenantsInForce is one Tenants as the handlers read it: the limits made
// into limiters. It is never changed once stored; SetTenants stores a new
// one.
type tenantsInForce struct {
	auth   Authenticator
	quotas map[string]Quota
	limits map[string]*tenantLimiter
}

// check refuses what New refuses of the tenants.
func (t Tenants) check(usage bool) error {
	if t.Auth == nil {
		return errors.New("httpapi: the tenants need an Authenticator")
	}
	for tenant, q := range t.Quotas {
		if q.MaxActiveRuns < 0 || q.MaxInFlightEffects < 0 || q.TokenBudget < 0 || q.MaxStoredBytes < 0 {
			return errors.New("httpapi: tenant " + tenant + ": quotas must be 0 (no limit) or positive")
		}
		if q.TokenBudget > 0 && !usage {
			return errors.New("httpapi: tenant " + tenant + " has a token budget: Config.Usage must be set (and observe the runtime)")
		}
	}
	for tenant, l := range t.Limits {
		if l.Requests.PerSecond < 0 || l.Submissions.PerSecond < 0 || l.MaxConcurrentReads < 0 {
			return errors.New("httpapi: tenant " + tenant + ": limits must be 0 (no limit) or positive")
		}
	}
	return nil
}

// Check refuses what SetTenants refuses.
func (t Tenants) Check() error { return t.check(true) }

// tenants returns the tenants in force now.
func (s *Server) tenants() *tenantsInForce { return s.inForce.Load() }

// SetTenants puts t in force for the requests that start from now on; a
// request under way finishes with the tenants it started with. A tenant
// whose limits are unchanged keeps its limiters (the tokens left in its
// buckets, its reads in progress); changed limits start full. t is checked
// as New checks Config, and refused whole.
func (s *Server) SetTenants(t Tenants) error {
	if err := t.check(true); err != nil {
		return err
	}
	s.inForce.Store(s.inForceFrom(t, s.tenants()))
	return nil
}

// inForceFrom makes t into the tenants in force, reusing the limiters of
// old (nil: none) whose limits t keeps.
func (s *Server) inForceFrom(t Tenants, old *tenantsInForce) *tenantsInForce {
	limits := newTenantLimiters(t.Limits)
	if old != nil {
		for tenant, tl := range limits {
			if prev, ok := old.limits[tenant]; ok && prev.limits == tl.limits {
				limits[tenant] = prev
			}
		}
	}
	return &tenantsInForce{auth: t.Auth, quotas: maps.Clone(t.Quotas), limits: limits}
}
