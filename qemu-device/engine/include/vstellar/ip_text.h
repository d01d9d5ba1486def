// IP addresses as people write them: "10.0.0.1" or "fd77::1" in, the same
// out (an IPv4 address prints as a dotted quad, not as ::ffff:a.b.c.d).
#pragma once
#include <string>

#include "vstellar/types.h"

namespace vstellar {

// False (and *out unchanged) if s is neither an IPv4 nor an IPv6 address.
bool parse_ip(const std::string& s, IpAddr* out);
std::string to_string(const IpAddr& a);
// "10.77.0.0/24", "fd77::/64", or an address alone (a prefix of all its
// bits). False (and *out unchanged) for anything else, a length beyond
// the family's bits included.
bool parse_prefix(const std::string& s, IpPrefix* out);
std::string to_string(const IpPrefix& p);

}  // namespace vstellar
