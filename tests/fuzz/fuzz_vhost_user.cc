// Fuzz target: vhost-user messages.
//
// The daemon's side of one vhost-user connection: bytes (and file
// descriptors) arrive on a non-blocking unix socket, MessageReader cuts
// them into messages, Session validates and applies each one, as
// vstellard's connection loop does; a memory table Session takes goes on
// to PVDMA (Pvdma::Attach, charged to budgets as a device's is), as in
// Device::OnMessage. The input is what the frontend (QEMU, or anything
// that can connect to the socket) sends, in chunks, so messages split
// across reads are covered too.
//
// Input: records of  ctl(1) len(2, little-endian) bytes(len).  Each record
// is one sendmsg() of its bytes; ctl bits 0-1 give how many memfds ride
// along as SCM_RIGHTS, bit 2 names them "vstellar-doorbell" instead of
// "memory-backend-memfd". They are 64 KiB each, or, with bit 3, sparse
// files of 2^(20 + 3k) bytes (k = bits 4-7, at most 2^62): a frontend that
// lies about how much guest memory there is costs it nothing (a region
// of 2^60 bytes once made PVDMA's block table throw). After each
// record the reader drains the socket and every whole message is handled;
// an error ends the connection, as in the daemon.
//
// What counts as a bug: a sanitizer report (an allocation too large
// included), a crash, an exception, or a hang.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "vstellard/memory_budget.h"
#include "vstellard/pvdma.h"
#include "vstellard/vhost_user.h"

namespace {

using namespace vstellard;

constexpr uint64_t kMemfdSize = 64 << 10;

int MakeMemfd(bool doorbell, uint64_t size) {
  int fd = memfd_create(doorbell ? "vstellar-doorbell" : "memory-backend-memfd", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || ftruncate(fd, off_t(size)) != 0) abort();
  return fd;
}

uint64_t MemfdSize(uint8_t ctl) {
  if (!(ctl & 8)) return kMemfdSize;
  return uint64_t{1} << std::min(20 + 3 * (ctl >> 4), 62);
}

// Sends bytes with nfds fresh memfds attached; a full socket drops the rest
// (the reader sees a short message, which it must handle anyway).
void Send(int sock, const uint8_t* p, size_t len, int nfds, bool doorbell, uint64_t size) {
  int fds[3];
  for (int i = 0; i < nfds; i++) fds[i] = MakeMemfd(doorbell, size);
  uint8_t dummy = 0;
  iovec iov{const_cast<uint8_t*>(len ? p : &dummy), len ? len : 1};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(fds))] = {};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (nfds) {
    mh.msg_control = ctrl;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  // Fds need at least one byte to travel with; without fds, send nothing
  // for an empty record.
  if (len || nfds) (void)sendmsg(sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
  for (int i = 0; i < nfds; i++) close(fds[i]);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) abort();
  fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
  Fd frontend(sv[1]);
  int daemon_end = sv[0];

  DeviceState state{DeviceConfig::Default()};
  Session session{state};
  // The daemon's defaults: 1 GiB per device, 4 GiB in all.
  Pvdma pvdma;
  pvdma.set_budgets(std::make_shared<MemoryBudget>(uint64_t{1} << 30), std::make_shared<MemoryBudget>(uint64_t{4} << 30));
  MessageReader reader;
  bool open = true;
  // Reads and handles what has arrived; false once the connection ends.
  auto drain = [&] {
    for (;;) {
      Message m;
      std::string err;
      switch (reader.Read(daemon_end, &m, &err)) {
        case MessageReader::Result::kMessage: {
          const bool table = m.hdr.request == uint32_t(Request::kSetMemTable);
          if (!session.Handle(std::move(m)).ok()) return false;
          std::string why;
          if (table && !pvdma.Attach(session.regions(), &why)) return false;
          break;
        }
        case MessageReader::Result::kAgain: return true;
        case MessageReader::Result::kClosed:
        case MessageReader::Result::kError: return false;
      }
    }
  };

  size_t pos = 0;
  while (open && pos + 3 <= size) {
    uint8_t ctl = data[pos];
    size_t len = size_t(data[pos + 1]) | size_t(data[pos + 2]) << 8;
    pos += 3;
    len = std::min(len, size - pos);
    Send(frontend.get(), data + pos, len, ctl & 3, ctl & 4, MemfdSize(ctl));
    pos += len;
    open = drain();
  }
  if (open) {
    shutdown(frontend.get(), SHUT_WR);  // EOF, maybe in the middle of a message
    drain();
  }
  close(daemon_end);
  return 0;
}
