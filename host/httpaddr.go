package host

import (
	"net/netip"
)

// refusedReason says why agenthost_http never dials an address a host
// name resolved to ("loopback", "private", …), or returns "" for an
// address on the public internet. Only a literal entry in the allowed hosts reaches an address
// refused here, and only by that literal (httpGate.dial).
//
// The rules cover every IPv4 and IPv6 form of the same destination: an
// IPv4-mapped (::ffff:a.b.c.d) or IPv4-compatible (::a.b.c.d) address,
// NAT64 (64:ff9b::/96) and 6to4 (2002::/16) are judged by the IPv4
// address they carry, since a dual-stack host or a translator delivers
// them to it.
func refusedReason(a netip.Addr) string {
	if !a.IsValid() {
		return "not an address"
	}
	a = a.WithZone("")
	if a.Is4In6() {
		if why := refusedReason(a.Unmap()); why != "" {
			return "IPv4-mapped " + why
		}
		return ""
	}
	switch {
	case a.IsUnspecified():
		return "unspecified"
	case a.IsLoopback():
		return "loopback"
	case a.IsLinkLocalUnicast():
		return "link-local"
	case a.IsMulticast():
		return "multicast"
	case a.IsPrivate():
		return "private"
	}
	if a.Is6() {
		if p, ok := embeddingIPv4(a); ok {
			if why := refusedReason(p.v4); why != "" {
				return p.name + " " + why
			}
			if p.refuseAll {
				return p.name
			}
			return ""
		}
	}
	for _, r := range specialPurpose {
		if r.prefix.Contains(a) {
			return r.why
		}
	}
	return ""
}

// specialPurpose are the ranges of the IANA special-purpose registries
// (RFC 6890 and its updates) that are not reachable on the public
// internet, beyond what netip's Is* methods name.
var specialPurpose = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "this network (0.0.0.0/8)"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared address space (CGNAT, 100.64.0.0/10)"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments (192.0.0.0/24)"},
	{netip.MustParsePrefix("192.0.2.0/24"), "documentation (192.0.2.0/24)"},
	{netip.MustParsePrefix("192.88.99.0/24"), "6to4 relay anycast (192.88.99.0/24)"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking (198.18.0.0/15)"},
	{netip.MustParsePrefix("198.51.100.0/24"), "documentation (198.51.100.0/24)"},
	{netip.MustParsePrefix("203.0.113.0/24"), "documentation (203.0.113.0/24)"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved or broadcast (240.0.0.0/4)"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "local-use NAT64 (64:ff9b:1::/48)"},
	{netip.MustParsePrefix("100::/64"), "discard-only (100::/64)"},
	{netip.MustParsePrefix("2001::/23"), "IETF protocol assignments (2001::/23)"},
	{netip.MustParsePrefix("2001:db8::/32"), "documentation (2001:db8::/32)"},
	{netip.MustParsePrefix("3fff::/20"), "documentation (3fff::/20)"},
	{netip.MustParsePrefix("5f00::/16"), "segment routing (5f00::/16)"},
	{netip.MustParsePrefix("fec0::/10"), "site-local (fec0::/10)"},
}

// embedded is an IPv6 address that carries an IPv4 one.
type embedded struct {
	name      string
	v4        netip.Addr
	refuseAll bool // refused even when the IPv4 address is public
}

var (
	ipv4Compatible = netip.MustParsePrefix("::/96")
	ipv4Translated = netip.MustParsePrefix("::ffff:0:0:0/96")
	nat64          = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour      = netip.MustParsePrefix("2002::/16")
)

// embeddingIPv4 returns the IPv4 address an IPv6 one carries, for the
// forms that carry one (the mapped form is Unmap's).
func embeddingIPv4(a netip.Addr) (embedded, bool) {
	b := a.As16()
	last4 := netip.AddrFrom4([4]byte(b[12:16]))
	switch {
	case ipv4Compatible.Contains(a): // :: and ::1 are caught before
		return embedded{name: "IPv4-compatible", v4: last4, refuseAll: true}, true
	case ipv4Translated.Contains(a):
		return embedded{name: "IPv4-translated", v4: last4, refuseAll: true}, true
	case nat64.Contains(a):
		return embedded{name: "NAT64", v4: last4}, true
	case sixToFour.Contains(a):
		return embedded{name: "6to4", v4: netip.AddrFrom4([4]byte(b[2:6]))}, true
	}
	return embedded{}, false
}
