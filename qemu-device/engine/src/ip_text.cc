#include "vstellar/ip_text.h"

#include <arpa/inet.h>

#include <cstring>

namespace vstellar {

bool parse_ip(const std::string& s, IpAddr* out) {
  in_addr v4;
  if (inet_pton(AF_INET, s.c_str(), &v4) == 1) {
    *out = IpAddr(ntohl(v4.s_addr));
    return true;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, s.c_str(), &v6) != 1) return false;
  *out = IpAddr::from_bytes(v6.s6_addr);
  return true;
}

std::string to_string(const IpAddr& a) {
  char buf[INET6_ADDRSTRLEN];
  if (a.is_v4()) {
    in_addr v4{htonl(a.v4())};
    inet_ntop(AF_INET, &v4, buf, sizeof(buf));
  } else {
    in6_addr v6;
    std::memcpy(v6.s6_addr, a.b.data(), 16);
    inet_ntop(AF_INET6, &v6, buf, sizeof(buf));
  }
  return buf;
}

bool parse_prefix(const std::string& s, IpPrefix* out) {
  const size_t slash = s.find('/');
  IpPrefix p;
  if (!parse_ip(s.substr(0, slash), &p.addr)) return false;
  const unsigned max = p.addr.is_v4() ? 32 : 128;
  unsigned len = max;
  if (slash != std::string::npos) {
    const std::string n = s.substr(slash + 1);
    if (n.empty() || n.size() > 3 || n.find_first_not_of("0123456789") != std::string::npos) return false;
    len = unsigned(std::stoul(n));
    if (len > max) return false;
  }
  p.len = uint8_t(len);
  *out = p;
  return true;
}

std::string to_string(const IpPrefix& p) { return to_string(p.addr) + "/" + std::to_string(p.len); }

}  // namespace vstellar
