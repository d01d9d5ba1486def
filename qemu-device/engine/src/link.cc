#include "vstellar/link.h"

#include <vector>

namespace vstellar {

void Link::send_trailed(uint16_t path, const IpAddr& src, const Endpoint& dst, const uint8_t* hdr,
                        size_t hdr_len, const HostSpan* payload, size_t nspans, const uint8_t* trailer,
                        size_t trailer_len) {
  std::vector<HostSpan> spans(payload, payload + nspans);
  if (trailer_len) spans.push_back(HostSpan{const_cast<uint8_t*>(trailer), trailer_len});
  send(path, src, dst, hdr, hdr_len, spans.data(), spans.size());
}

}  // namespace vstellar
