// vhost-user server side for vstellard; see include/vstellard/vhost_user.h.
#include "vstellard/vhost_user.h"

#include <cerrno>
#include <cstring>
#include <endian.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

namespace vstellard {

namespace {
// MSG_CTRUNC: more descriptors than a message may carry, or ones the
// kernel could not install because the daemon reached RLIMIT_NOFILE.
constexpr const char* kFdsCutOff =
    "file descriptors cut off (too many with one message, or the daemon's RLIMIT_NOFILE reached)";

bool IsPow2(uint64_t v) { return v && !(v & (v - 1)); }

bool AddOverflows(uint64_t a, uint64_t b) { return a + b < a; }

Outcome Fail(std::string e) { return Outcome{std::nullopt, std::move(e)}; }

std::vector<uint8_t> ReplyBytes(const Header& req, const void* payload, uint32_t size) {
  Header h{req.request, kFlagVersion | kFlagReply, size};
  std::vector<uint8_t> out(sizeof(h) + size);
  std::memcpy(out.data(), &h, sizeof(h));
  if (size) std::memcpy(out.data() + sizeof(h), payload, size);
  return out;
}

std::vector<uint8_t> ReplyU64(const Header& req, uint64_t v) {
  return ReplyBytes(req, &v, sizeof(v));
}

template <typename T>
bool Payload(const Message& m, T* out, std::string* err) {
  if (m.payload.size() != sizeof(T)) {
    *err = "request " + std::to_string(m.hdr.request) + ": payload of " +
           std::to_string(m.payload.size()) + " bytes, expected " + std::to_string(sizeof(T));
    return false;
  }
  std::memcpy(out, m.payload.data(), sizeof(T));
  return true;
}

// Requests that always have a reply, whatever REPLY_ACK says.
bool HasReply(Request r) {
  switch (r) {
    case Request::kGetFeatures:
    case Request::kGetProtocolFeatures:
    case Request::kGetVringBase:
    case Request::kGetQueueNum:
    case Request::kGetConfig:
    case Request::kSetLogBase:  // answered when LOG_SHMFD is negotiated (always, here)
    case Request::kSetDeviceStateFd:
    case Request::kCheckDeviceState:
      return true;
    default:
      return false;
  }
}

}  // namespace


Session::Session(DeviceState& state, std::shared_ptr<DirtyLog> log)
    : state_(state), log_(std::move(log)), vrings_(state.device().max_queues) {}

uint64_t Session::offered_features() const {
  return (state_.device().device_features & 0xffffff) | Bit(kFeatureLogAll) | Bit(kFeatureIndirectDesc) |
         Bit(kFeatureEventIdx) | Bit(kFeatureProtocolFeatures) | Bit(kFeatureVersion1) | Bit(kFeatureRingReset);
}

uint64_t Session::offered_protocol_features() const {
  uint64_t f = Bit(kProtocolMq) | Bit(kProtocolLogShmfd) | Bit(kProtocolReplyAck) | Bit(kProtocolConfig) |
               Bit(kProtocolResetDevice);
  if (state_transfer_) f |= Bit(kProtocolDeviceState);
  return f;
}

bool Session::CheckVringIndex(uint32_t index, std::string* err) const {
  if (index >= vrings_.size()) {
    *err = "vring index " + std::to_string(index) + " out of range (" +
           std::to_string(vrings_.size()) + " queues)";
    return false;
  }
  return true;
}

const MemRegion* Session::FindByQemuVa(uint64_t va, uint64_t len) const {
  if (AddOverflows(va, len)) return nullptr;
  for (const MemRegion& r : regions_)
    if (va >= r.qemu_va && va + len <= r.qemu_va + r.size) return &r;
  return nullptr;
}

Outcome Session::Handle(Message&& m) {
  const Header h = m.hdr;
  Outcome out = HandleOne(m);
  // REPLY_ACK: a request without its own reply gets 0 (done) or 1 (refused).
  const bool need_ack = (h.flags & kFlagNeedReply) && (acked_protocol_ & Bit(kProtocolReplyAck)) &&
                        !HasReply(static_cast<Request>(h.request)) &&
                        (h.flags & kFlagVersionMask) == kFlagVersion;
  if (need_ack && !out.reply) out.reply = ReplyU64(h, out.ok() ? 0 : 1);
  return out;
}

// Checks the header, then hands the request to the handler of its group.
// Requests that touch the memory table or a vring need SET_OWNER first.
Outcome Session::HandleOne(Message& m) {
  const Header& h = m.hdr;
  if ((h.flags & kFlagVersionMask) != kFlagVersion)
    return Fail("unsupported vhost-user version in flags " + std::to_string(h.flags));
  if (h.flags & ~(kFlagVersionMask | kFlagNeedReply))
    return Fail("reserved or reply flag set in request flags " + std::to_string(h.flags));
  if (h.size != m.payload.size()) return Fail("header size does not match payload");

  std::string err;
  switch (static_cast<Request>(h.request)) {
    case Request::kGetFeatures:
    case Request::kSetFeatures:
    case Request::kGetProtocolFeatures:
    case Request::kSetProtocolFeatures:
      return HandleFeatures(m);

    case Request::kSetOwner:
    case Request::kResetOwner:
    case Request::kGetQueueNum:
      return HandleOwner(m);

    case Request::kSetMemTable:
      if (!HasOwner(h, &err)) return Fail(err);
      return SetMemTable(m);

    case Request::kSetVringNum:
    case Request::kSetVringBase:
    case Request::kGetVringBase:
    case Request::kSetVringEnable:
      return HandleVringState(m);

    case Request::kSetVringAddr: {
      VringAddr a;
      if (!HasOwner(h, &err) || !NoFds(m, &err) || !Payload(m, &a, &err)) return Fail(err);
      return SetVringAddr(a);
    }

    case Request::kSetVringKick:
      if (!HasOwner(h, &err)) return Fail(err);
      return SetVringFd(m, &Vring::kick);
    case Request::kSetVringCall:
      if (!HasOwner(h, &err)) return Fail(err);
      return SetVringFd(m, &Vring::call);
    case Request::kSetVringErr:
      if (!HasOwner(h, &err)) return Fail(err);
      return SetVringFd(m, &Vring::err);

    case Request::kGetConfig:
      if (!NoFds(m, &err)) return Fail(err);
      return GetConfig(m);
    case Request::kSetConfig:
      if (!NoFds(m, &err)) return Fail(err);
      return SetConfig(m);

    case Request::kSetLogBase:
      if (!HasOwner(h, &err)) return Fail(err);
      return SetLogBase(m);
    case Request::kSetLogFd:
      // An eventfd to signal log updates with; QEMU never sends it and the
      // log works without it.
      return Fail("SET_LOG_FD is not supported (the log needs no notification)");

    case Request::kResetDevice:
      if (!Empty(m, "RESET_DEVICE", &err)) return Fail(err);
      if (!(acked_protocol_ & Bit(kProtocolResetDevice)))
        return Fail("RESET_DEVICE without the RESET_DEVICE protocol feature");
      return Outcome{};  // the device resets its objects (Device::HandleMessage)

    case Request::kSetDeviceStateFd:
    case Request::kCheckDeviceState:
      return DeviceStateRequest(m);

    default:
      return Outcome{std::nullopt, "unsupported request " + std::to_string(h.request)};
  }
}

bool Session::HasOwner(const Header& h, std::string* err) const {
  if (owner_) return true;
  *err = "request " + std::to_string(h.request) + " before SET_OWNER";
  return false;
}

// Only the fd-carrying requests may carry fds.
bool Session::NoFds(const Message& m, std::string* err) {
  if (m.fds.empty()) return true;
  *err = "request " + std::to_string(m.hdr.request) + " carries unexpected fds";
  return false;
}

// A request that carries nothing: no payload, no fds.
bool Session::Empty(const Message& m, const char* name, std::string* err) {
  if (!m.payload.empty()) {
    *err = std::string(name) + " with payload";
    return false;
  }
  return NoFds(m, err);
}

// GET/SET_FEATURES and GET/SET_PROTOCOL_FEATURES: a set acks only what was
// offered.
Outcome Session::HandleFeatures(const Message& m) {
  const Header& h = m.hdr;
  std::string err;
  uint64_t f;
  switch (static_cast<Request>(h.request)) {
    case Request::kGetFeatures:
      if (!Empty(m, "GET_FEATURES", &err)) return Fail(err);
      return Outcome{ReplyU64(h, offered_features()), {}};
    case Request::kGetProtocolFeatures:
      if (!Empty(m, "GET_PROTOCOL_FEATURES", &err)) return Fail(err);
      return Outcome{ReplyU64(h, offered_protocol_features()), {}};
    case Request::kSetFeatures:
      if (!NoFds(m, &err) || !Payload(m, &f, &err)) return Fail(err);
      if (f & ~offered_features()) return Fail("SET_FEATURES acks features never offered");
      state_.set_acked_features(f);
      features_set_ = true;
      log_->SetLogging(HasBit(f, kFeatureLogAll));
      return Outcome{};
    default:  // kSetProtocolFeatures
      if (!NoFds(m, &err) || !Payload(m, &f, &err)) return Fail(err);
      if (f & ~offered_protocol_features()) return Fail("SET_PROTOCOL_FEATURES acks features never offered");
      acked_protocol_ = f;
      return Outcome{};
  }
}

// SET_OWNER, RESET_OWNER (which forgets the memory table and every vring)
// and GET_QUEUE_NUM.
Outcome Session::HandleOwner(const Message& m) {
  const Header& h = m.hdr;
  std::string err;
  switch (static_cast<Request>(h.request)) {
    case Request::kSetOwner:
      if (!Empty(m, "SET_OWNER", &err)) return Fail(err);
      if (owner_) return Fail("SET_OWNER twice");
      owner_ = true;
      return Outcome{};
    case Request::kResetOwner:
      if (!Empty(m, "RESET_OWNER", &err)) return Fail(err);
      owner_ = false;
      features_set_ = false;
      state_.set_acked_features(0);
      regions_.clear();
      for (Vring& v : vrings_) v = Vring{};
      return Outcome{};
    default:  // kGetQueueNum
      if (!Empty(m, "GET_QUEUE_NUM", &err)) return Fail(err);
      if (!(acked_protocol_ & Bit(kProtocolMq))) return Fail("GET_QUEUE_NUM without the MQ protocol feature");
      return Outcome{ReplyU64(h, vrings_.size()), {}};
  }
}

// The requests that carry a VringState {index, num}: SET_VRING_NUM,
// SET_VRING_BASE, GET_VRING_BASE (which stops the ring) and
// SET_VRING_ENABLE. A running ring's size and base cannot change.
Outcome Session::HandleVringState(const Message& m) {
  const Header& h = m.hdr;
  std::string err;
  VringState s;
  if (!HasOwner(h, &err) || !NoFds(m, &err) || !Payload(m, &s, &err) || !CheckVringIndex(s.index, &err))
    return Fail(err);
  Vring& v = vrings_[s.index];
  switch (static_cast<Request>(h.request)) {
    case Request::kSetVringNum:
      if (!IsPow2(s.num) || s.num > kMaxVringSize)
        return Fail("vring " + std::to_string(s.index) + ": size " + std::to_string(s.num) +
                    " is not a power of two up to 32768");
      if (v.running()) return Fail("SET_VRING_NUM on a running vring");
      v.num = s.num;
      v.addr_set = false;
      return Outcome{};
    case Request::kSetVringBase:
      if (s.num > 0xffff) return Fail("SET_VRING_BASE: index " + std::to_string(s.num) + " over 16 bits");
      if (v.running()) return Fail("SET_VRING_BASE on a running vring");
      v.base = static_cast<uint16_t>(s.num);
      return Outcome{};
    case Request::kGetVringBase: {
      // Stops the ring: the kick fd is dropped, the state goes back.
      v.started = false;
      v.enabled = false;
      v.kick = Fd();
      VringState r{s.index, v.base};
      return Outcome{ReplyBytes(h, &r, sizeof(r)), {}};
    }
    default:  // kSetVringEnable
      if (!HasBit(state_.acked_features(), kFeatureProtocolFeatures))
        return Fail("SET_VRING_ENABLE without VHOST_USER_F_PROTOCOL_FEATURES");
      if (s.num > 1) return Fail("SET_VRING_ENABLE: state " + std::to_string(s.num) + " is not 0 or 1");
      v.enabled = s.num == 1;
      return Outcome{};
  }
}

Outcome Session::SetMemTable(Message& m) {
  const size_t hdr = 8;
  if (m.payload.size() < hdr) return Fail("SET_MEM_TABLE: short payload");
  uint32_t n, padding;
  std::memcpy(&n, m.payload.data(), 4);
  std::memcpy(&padding, m.payload.data() + 4, 4);
  if (n == 0 || n > kMaxMemRegions) return Fail("SET_MEM_TABLE: " + std::to_string(n) + " regions (1..8)");
  if (padding != 0) return Fail("SET_MEM_TABLE: non-zero padding");
  if (m.payload.size() != hdr + n * sizeof(MemRegionDesc)) return Fail("SET_MEM_TABLE: payload size does not match region count");
  if (m.fds.size() != n) return Fail("SET_MEM_TABLE: " + std::to_string(m.fds.size()) + " fds for " + std::to_string(n) + " regions");

  std::vector<MemRegion> table;
  uint64_t total = 0;
  for (uint32_t i = 0; i < n; i++) {
    MemRegionDesc d;
    std::memcpy(&d, m.payload.data() + hdr + i * sizeof(d), sizeof(d));
    const std::string where = "SET_MEM_TABLE region " + std::to_string(i) + ": ";
    const uint64_t page = 4096;
    if (d.memory_size == 0) return Fail(where + "empty");
    if ((d.guest_phys_addr | d.memory_size | d.userspace_addr | d.mmap_offset) & (page - 1))
      return Fail(where + "not 4 KiB aligned");
    if (AddOverflows(d.guest_phys_addr, d.memory_size) || AddOverflows(d.userspace_addr, d.memory_size) ||
        AddOverflows(d.mmap_offset, d.memory_size))
      return Fail(where + "range wraps around");
    struct stat st;
    if (fstat(m.fds[i].get(), &st) != 0) return Fail(where + "fd: " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) return Fail(where + "fd is not a memory file");
    if (d.mmap_offset + d.memory_size > static_cast<uint64_t>(st.st_size))
      return Fail(where + "extends past the end of its file");
    // A sparse file can be of any size: its size proves nothing.
    if (d.memory_size > state_.device().max_guest_memory - total)
      return Fail(where + "the table declares more than the " + std::to_string(state_.device().max_guest_memory) +
                  " bytes of guest memory a device may have (--guest-memory-limit)");
    total += d.memory_size;
    for (const MemRegion& o : table) {
      if (d.guest_phys_addr < o.gpa + o.size && o.gpa < d.guest_phys_addr + d.memory_size)
        return Fail(where + "overlaps another region's guest-physical range");
      if (d.userspace_addr < o.qemu_va + o.size && o.qemu_va < d.userspace_addr + d.memory_size)
        return Fail(where + "overlaps another region's QEMU address range");
    }
    MemRegion r;
    r.gpa = d.guest_phys_addr;
    r.size = d.memory_size;
    r.qemu_va = d.userspace_addr;
    r.offset = d.mmap_offset;
    r.doorbell = ParseDoorbellName(MemfdName(m.fds[i].get()), &r.doorbell_id);
    r.fd = std::move(m.fds[i]);
    table.push_back(std::move(r));
  }
  // Recorded, not mapped (PVDMA maps on first use).
  regions_ = std::move(table);
  // Ring addresses are QEMU addresses: re-check them against the new table.
  for (Vring& v : vrings_)
    if (v.addr_set && (!FindByQemuVa(v.desc, 16ull * v.num) || !FindByQemuVa(v.avail, 6 + 2ull * v.num) ||
                       !FindByQemuVa(v.used, 6 + 8ull * v.num)))
      return Fail("SET_MEM_TABLE: a running vring is outside the new table");
  return Outcome{};
}

// SET_LOG_BASE (with LOG_SHMFD): the dirty bitmap, in a file shared with
// QEMU, which waits for the answer before it relies on the log.
Outcome Session::SetLogBase(Message& m) {
  LogBase b;
  std::string err;
  if (!Payload(m, &b, &err)) return Fail(err);
  if (m.fds.size() != 1) return Fail("SET_LOG_BASE: " + std::to_string(m.fds.size()) + " fds, expected 1");
  if (!log_->Map(std::move(m.fds[0]), b.mmap_size, b.mmap_offset, &err)) return Fail(err);
  return Outcome{ReplyU64(m.hdr, 0), {}};
}

// SET_DEVICE_STATE_FD and CHECK_DEVICE_STATE: the device's state in and
// out for migration, through the DeviceStateTransfer the device lends.
Outcome Session::DeviceStateRequest(Message& m) {
  std::string err;
  if (!HasOwner(m.hdr, &err)) return Fail(err);
  if (!state_transfer_ || !(acked_protocol_ & Bit(kProtocolDeviceState)))
    return Fail("device state transfer without the DEVICE_STATE protocol feature");
  if (static_cast<Request>(m.hdr.request) == Request::kCheckDeviceState) {
    if (!Empty(m, "CHECK_DEVICE_STATE", &err)) return Fail(err);
    return Outcome{ReplyU64(m.hdr, state_transfer_->CheckStateTransfer() ? 0 : 1), {}};
  }
  DeviceStateFd d;
  if (!Payload(m, &d, &err)) return Fail(err);
  if (m.fds.size() != 1) return Fail("SET_DEVICE_STATE_FD: " + std::to_string(m.fds.size()) + " fds, expected 1");
  if (d.direction > kStateLoad) return Fail("SET_DEVICE_STATE_FD: direction " + std::to_string(d.direction));
  // Only the stopped phase exists (the device's rings are stopped).
  if (d.phase != 0) return Fail("SET_DEVICE_STATE_FD: phase " + std::to_string(d.phase) + " (only 0, stopped)");
  const bool ok = state_transfer_->BeginStateTransfer(d.direction == kStateSave, std::move(m.fds[0]));
  // Bit 8: no fd of ours comes back; the low byte: 0 accepted, else refused.
  return Outcome{ReplyU64(m.hdr, kVringNoFd | (ok ? 0 : 1)), {}};
}

const MemRegion* Session::DoorbellRegion() const {
  const uint32_t id = le32toh(state_.config().db_region_id);
  const MemRegion* found = nullptr;
  for (const MemRegion& r : regions_) {
    if (!r.doorbell) continue;
    if (id != 0 && r.doorbell_id == id) return &r;
    if (id == 0) {
      if (found) return nullptr;  // whose is it? not ours to guess
      found = &r;
    }
  }
  return found;
}

Outcome Session::SetVringAddr(const VringAddr& a) {
  std::string err;
  if (!CheckVringIndex(a.index, &err)) return Fail(err);
  Vring& v = vrings_[a.index];
  const std::string where = "SET_VRING_ADDR " + std::to_string(a.index) + ": ";
  // VHOST_VRING_F_LOG: log the used ring's writes at log_guest_addr. The
  // device marks every write by its guest-physical address (DirtyLog), the
  // used ring's included, so the flag needs nothing more here.
  if (a.flags & ~kVringFlagLog) return Fail(where + "unknown flags " + std::to_string(a.flags));
  if (v.num == 0) return Fail(where + "before SET_VRING_NUM");
  // QEMU turns logging on and off on running rings by sending their
  // addresses again with the flag changed: nothing moves then.
  if (v.running() && v.addr_set && a.desc_user_addr == v.desc && a.avail_user_addr == v.avail &&
      a.used_user_addr == v.used)
    return Outcome{};
  // The device reads the ring where it was: moving it under the running
  // device would make it read and write wherever the old addresses now are.
  if (v.running()) return Fail(where + "on a running vring (stop it with GET_VRING_BASE first)");
  if ((a.desc_user_addr & 15) || (a.avail_user_addr & 1) || (a.used_user_addr & 3))
    return Fail(where + "misaligned ring");
  if (!FindByQemuVa(a.desc_user_addr, 16ull * v.num) || !FindByQemuVa(a.avail_user_addr, 6 + 2ull * v.num) ||
      !FindByQemuVa(a.used_user_addr, 6 + 8ull * v.num))
    return Fail(where + "ring outside guest memory");
  v.desc = a.desc_user_addr;
  v.avail = a.avail_user_addr;
  v.used = a.used_user_addr;
  v.addr_set = true;
  return Outcome{};
}

Outcome Session::SetVringFd(Message& m, Fd Vring::*which) {
  uint64_t u;
  std::string err;
  if (!Payload(m, &u, &err)) return Fail(err);
  const uint32_t index = u & kVringIndexMask;
  if (u & ~(kVringIndexMask | kVringNoFd)) return Fail("vring fd message: reserved bits set");
  if (!CheckVringIndex(index, &err)) return Fail(err);
  const bool nofd = u & kVringNoFd;
  if (m.fds.size() != (nofd ? 0u : 1u)) return Fail("vring fd message: wrong fd count");
  Vring& v = vrings_[index];
  v.*which = nofd ? Fd() : std::move(m.fds[0]);
  if (which == &Vring::kick) {
    // A kick fd (or NOFD: polling) starts the ring; it needs its layout.
    if (!v.addr_set) return Fail("SET_VRING_KICK before SET_VRING_ADDR");
    v.started = true;
  }
  return Outcome{};
}

// GET_CONFIG's and SET_CONFIG's header: the payload holds it and exactly
// c->size bytes after it, and flags are 0 (no migration). Empty if so.
static std::string ConfigPayload(const Message& m, const char* what, ConfigHeader* c) {
  if (m.payload.size() < sizeof(*c)) return std::string(what) + ": short payload";
  std::memcpy(c, m.payload.data(), sizeof(*c));
  if (c->size > kMaxConfigSize || m.payload.size() != sizeof(*c) + c->size)
    return std::string(what) + ": size does not match payload";
  if (c->flags != 0) return std::string(what) + ": flags must be 0 (no migration)";
  return "";
}

Outcome Session::GetConfig(const Message& m) {
  ConfigHeader c;
  if (std::string err = ConfigPayload(m, "GET_CONFIG", &c); !err.empty()) return Fail(err);
  if (c.offset > sizeof(virtio_vstellar_config) || c.size > sizeof(virtio_vstellar_config) - c.offset)
    return Fail("GET_CONFIG: range outside the 128-byte config space");
  std::vector<uint8_t> p(sizeof(c) + c.size);
  std::memcpy(p.data(), &c, sizeof(c));
  std::memcpy(p.data() + sizeof(c), reinterpret_cast<const uint8_t*>(&state_.config()) + c.offset, c.size);
  Outcome out;
  out.reply = ReplyBytes(m.hdr, p.data(), static_cast<uint32_t>(p.size()));
  return out;
}

// The config space is read-only for the driver; the frontend writes one
// field, db_region_id, which tells which doorbell region is this device's.
Outcome Session::SetConfig(const Message& m) {
  ConfigHeader c;
  if (std::string err = ConfigPayload(m, "SET_CONFIG", &c); !err.empty()) return Fail(err);
  if (c.offset != offsetof(virtio_vstellar_config, db_region_id) || c.size != sizeof(uint32_t))
    return Fail("SET_CONFIG: only db_region_id (offset " +
                std::to_string(offsetof(virtio_vstellar_config, db_region_id)) +
                ", 4 bytes) is writable, not offset " + std::to_string(c.offset) + " size " + std::to_string(c.size));
  std::memcpy(&state_.mutable_device().config.db_region_id, m.payload.data() + sizeof(c), sizeof(uint32_t));
  return Outcome{};
}

bool ReadMessage(int sock, Message* m, std::string* err) {
  *m = Message{};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxMemRegions)];
  iovec iov{&m->hdr, sizeof(m->hdr)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
  while (n < 0 && errno == EINTR);
  // Take ownership of every fd that arrived, before any check can fail.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; i++) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      m->fds.emplace_back(fd);
    }
  }
  if (n == 0) {
    err->clear();
    return false;
  }
  if (n < 0) {
    *err = std::string("recvmsg: ") + std::strerror(errno);
    return false;
  }
  if (static_cast<size_t>(n) != sizeof(m->hdr)) {
    *err = "short vhost-user header";
    return false;
  }
  if (msg.msg_flags & MSG_CTRUNC) {
    *err = kFdsCutOff;
    return false;
  }
  if (m->hdr.size > kMaxPayload) {
    *err = "payload of " + std::to_string(m->hdr.size) + " bytes is too large";
    return false;
  }
  m->payload.resize(m->hdr.size);
  size_t got = 0;
  while (got < m->payload.size()) {
    ssize_t r = recv(sock, m->payload.data() + got, m->payload.size() - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      *err = r == 0 ? "connection closed inside a message" : std::string("recv: ") + std::strerror(errno);
      return false;
    }
    got += static_cast<size_t>(r);
  }
  return true;
}

MessageReader::Result MessageReader::Read(int sock, Message* m, std::string* err) {
  err->clear();
  auto* hdr_bytes = reinterpret_cast<uint8_t*>(&hdr_);
  while (hdr_got_ < sizeof(hdr_)) {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxMemRegions)];
    iovec iov{hdr_bytes + hdr_got_, sizeof(hdr_) - hdr_got_};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Result::kAgain;
    // Take ownership of every fd that arrived, before any check can fail.
    for (cmsghdr* c = n >= 0 ? CMSG_FIRSTHDR(&msg) : nullptr; c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; i++) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds_.emplace_back(fd);
      }
    }
    if (n < 0) {
      *err = std::string("recvmsg: ") + std::strerror(errno);
      return Result::kError;
    }
    if (n == 0) {
      if (hdr_got_) *err = "connection closed inside a message";
      return Result::kClosed;
    }
    if ((msg.msg_flags & MSG_CTRUNC) || fds_.size() > kMaxMemRegions) {
      *err = kFdsCutOff;
      return Result::kError;
    }
    hdr_got_ += size_t(n);
    if (hdr_got_ == sizeof(hdr_)) {
      if (hdr_.size > kMaxPayload) {
        *err = "payload of " + std::to_string(hdr_.size) + " bytes is too large";
        return Result::kError;
      }
      payload_.resize(hdr_.size);
      payload_got_ = 0;
    }
  }
  while (payload_got_ < payload_.size()) {
    const ssize_t r = recv(sock, payload_.data() + payload_got_, payload_.size() - payload_got_, MSG_DONTWAIT);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Result::kAgain;
    if (r == 0) {
      *err = "connection closed inside a message";
      return Result::kClosed;
    }
    if (r < 0) {
      *err = std::string("recv: ") + std::strerror(errno);
      return Result::kError;
    }
    payload_got_ += size_t(r);
  }
  *m = Message{};
  m->hdr = hdr_;
  m->payload = std::move(payload_);
  m->fds = std::move(fds_);
  hdr_ = Header{};
  hdr_got_ = 0;
  payload_.clear();
  payload_got_ = 0;
  fds_.clear();
  return Result::kMessage;
}

bool WriteAll(int sock, const std::vector<uint8_t>& b, std::string* err) {
  size_t done = 0;
  while (done < b.size()) {
    ssize_t w = send(sock, b.data() + done, b.size() - done, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      *err = std::string("send: ") + std::strerror(errno);
      return false;
    }
    done += static_cast<size_t>(w);
  }
  return true;
}

std::string MemfdName(int fd) {
  char link[64], target[256];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, target, sizeof(target) - 1);
  if (n <= 0) return "";
  std::string t(target, static_cast<size_t>(n));
  const std::string prefix = "/memfd:";
  if (t.rfind(prefix, 0) != 0) return "";
  t = t.substr(prefix.size());
  const std::string deleted = " (deleted)";
  if (t.size() >= deleted.size() && t.compare(t.size() - deleted.size(), deleted.size(), deleted) == 0)
    t.resize(t.size() - deleted.size());
  return t;
}

bool ParseDoorbellName(const std::string& name, uint32_t* id) {
  *id = 0;
  const std::string base = VSTELLAR_DB_MEMFD_NAME;
  if (name == base) return true;
  if (name.size() <= base.size() + 1 || name.compare(0, base.size() + 1, base + "-") != 0) return false;
  const std::string digits = name.substr(base.size() + 1);
  if (digits.size() > 10 || digits.find_first_not_of("0123456789") != std::string::npos) return false;
  const unsigned long long v = std::stoull(digits);
  if (v == 0 || v > UINT32_MAX) return false;
  *id = uint32_t(v);
  return true;
}

}  // namespace vstellard
