// Fuzz target: the RoCE v2 codec (vstellar/roce_wire.h) on hostile input.
//
// Input: flags(1) then one UDP payload. flags bit 1: IPv6 addresses
// instead of IPv4; bit 2: fix the ICRC up before parsing, so that the
// fuzzer gets past the check into the header parsing (a random ICRC almost
// never matches).
//
// What counts as a bug: a sanitizer report or crash, and a packet that
// parses, has its reserved bits zero, and does not build back to the same
// bytes (the parser and the builder disagree about the format).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "vstellar/roce_wire.h"

using namespace vstellar;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  // An exact-size copy, so that ASan sees any read past the end.
  std::vector<uint8_t> pkt(data + 1, data + size);
  roce::IpFields ip;
  if (flags & 1) {
    uint8_t a[16] = {0xfd, 0x77}, b[16] = {0xfd, 0x77};
    a[15] = 1;
    b[15] = 2;
    ip.src = IpAddr::from_bytes(a);
    ip.dst = IpAddr::from_bytes(b);
  } else {
    ip.src = IpAddr(0x0a4d0001);
    ip.dst = IpAddr(0x0a4d0002);
  }
  ip.src_port = 49152;
  if ((flags & 2) && pkt.size() >= roce::kBthLen + roce::kIcrcLen) {
    const uint32_t c = roce::icrc(ip, pkt.data(), pkt.size());
    for (int i = 0; i < 4; i++) pkt[pkt.size() - 4 + i] = uint8_t(c >> (8 * i));
  }
  roce::Packet p;
  if (roce::parse(pkt.data(), pkt.size(), ip, &p) != roce::ParseError::NONE) return 0;
  std::vector<uint8_t> out(roce::packet_len(p));
  if (roce::build(p, ip, out.data(), out.size()) != pkt.size()) abort();
  // Reserved bits and pad bytes are ignored on receipt (IBTA) and sent as
  // zero, so only a packet with them zero comes back whole: the 7 bits
  // after the BTH's A bit, the DETH's reserved byte and the pad, which the
  // ICRC covers. Byte 4 of the BTH (FECN, BECN, 6 reserved bits) is
  // outside the ICRC: taken as it came.
  bool zero = (pkt[8] & 0x7f) == 0;
  if (roce::opcode_info(p.bth.opcode).headers & roce::H_DETH) zero = zero && pkt[roce::kBthLen + 4] == 0;
  for (size_t i = 0; i < p.bth.pad; i++) zero = zero && p.payload[p.payload_len + i] == 0;
  if (!zero) return 0;
  out[4] = pkt[4];
  if (out != pkt) abort();
  return 0;
}
