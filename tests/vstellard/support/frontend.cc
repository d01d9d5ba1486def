// Test frontend for vstellard; see vstellard/frontend.h next to this file.
#include "vstellard/frontend.h"

#include <endian.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

namespace vstellard {

namespace {
constexpr uint16_t kDescNext = 1, kDescWrite = 2;
}  // namespace

Frontend::Frontend(FrontendOptions o) : o_(o), qs_(VSTELLAR_VQ_CQN0 + o.cq_queues) {}

std::vector<uint8_t> WithPages(const void* body, size_t n, const std::vector<uint64_t>& pages) {
  std::vector<uint8_t> v(n + 8 * pages.size());
  std::memcpy(v.data(), body, n);
  std::memcpy(v.data() + n, pages.data(), 8 * pages.size());
  return v;
}

std::vector<uint64_t> PagesFrom(uint64_t gpa, uint64_t n) {
  std::vector<uint64_t> pages;
  for (uint64_t i = 0; i < n; i++) pages.push_back(gpa + 4096 * i);
  return pages;
}

std::vector<uint8_t> CreateCqBody(uint32_t log_cqe, uint64_t gpa) {
  const uint32_t pages = uint32_t(std::max<uint64_t>(1, (uint64_t(sizeof(vstellar_cqe)) << log_cqe) / 4096));
  vstellar_cmd_create_cq c{};
  c.log_cqe = log_cqe;
  c.page_shift = 12;
  c.num_pages = pages;
  return WithPages(c, PagesFrom(gpa, pages));
}

std::vector<uint8_t> RegMrBody(uint32_t pdn, uint64_t gpa, uint64_t len, uint32_t access) {
  const std::vector<uint64_t> pages = PagesFrom(gpa, (len + 4095) / 4096);
  vstellar_cmd_reg_mr m{};
  m.pdn = pdn;
  m.access_flags = access;
  m.iova = gpa;
  m.length = len;
  m.page_shift = 12;
  m.num_pages = uint32_t(pages.size());
  return WithPages(m, pages);
}

vstellar_cmd_create_qp RcQpBody(uint32_t pdn, uint32_t cqn) {
  vstellar_cmd_create_qp c{};
  c.pdn = pdn;
  c.send_cqn = c.recv_cqn = cqn;
  c.qp_type = VSTELLAR_QPT_RC;
  c.sq_log_wqe = 6;
  c.sq_log_stride = 7;
  c.rq_log_wqe = 6;
  c.rq_log_stride = 6;
  c.page_shift = 12;
  c.max_send_sge = 4;
  c.max_recv_sge = 2;
  c.max_inline_data = 64;
  c.sq_pages = 2;
  c.rq_pages = 1;
  return c;
}

std::vector<uint8_t> CreateQpBody(const vstellar_cmd_create_qp& c, uint64_t ring) {
  return WithPages(c, PagesFrom(ring, uint64_t(c.sq_pages) + c.rq_pages));
}

vstellar_cmd_modify_qp RcModifyBody(uint32_t qpn, uint32_t dest, uint8_t path_mtu) {
  vstellar_cmd_modify_qp m{};
  m.qpn = qpn;
  m.attr.port = 1;
  m.attr.path_mtu = path_mtu;
  m.attr.timeout = 14;
  m.attr.retry_cnt = 7;
  m.attr.rnr_retry = 7;
  m.attr.max_rd_atomic = 4;
  m.attr.max_dest_rd_atomic = 4;
  m.attr.access_flags = VSTELLAR_ACCESS_VALID;
  m.attr.dest_qpn = dest;
  m.attr.av.dgid[10] = m.attr.av.dgid[11] = 0xff;
  m.attr.av.dgid[12] = 127;
  m.attr.av.dgid[15] = 1;
  return m;
}

void Frontend::RingDoorbell(uint32_t page, uint32_t off, uint32_t value, bool kick) {
  std::atomic_thread_fence(std::memory_order_release);
  DoorbellWord(page, off).store(htole32(value), std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (kick && DoorbellWord(page, 0).load()) Kick(VSTELLAR_VQ_KICK);
}

bool Frontend::TakeCqe(uint64_t gpa, uint32_t log, uint32_t ci, vstellar_cqe* out) {
  uint8_t* e = mem_ + gpa + sizeof(vstellar_cqe) * (ci & ((1u << log) - 1));
  const uint8_t want = ((ci >> log) & 1) ? 0 : 1;
  const uint8_t owner = std::atomic_ref<uint8_t>(e[sizeof(vstellar_cqe) - 1]).load(std::memory_order_acquire);
  if ((owner & VSTELLAR_CQE_OWNER) != want) return false;
  std::memcpy(out, e, sizeof(*out));
  return true;
}

Frontend::~Frontend() {
  if (sock_ >= 0) close(sock_);
  for (Queue& q : qs_) {
    if (q.kick >= 0) close(q.kick);
    if (q.call >= 0) close(q.call);
  }
  if (mem_) munmap(mem_, o_.mem_size);
  if (db_) munmap(db_, 1 << 16);
  if (ram_fd_ >= 0) close(ram_fd_);
  if (db_fd_ >= 0) close(db_fd_);
  for (const DeviceMemory& m : device_mem_) {
    munmap(m.p, m.size);
    close(m.fd);
  }
}

uint8_t* Frontend::AddDeviceMemory(uint64_t gpa, uint64_t size, std::string* err) {
  // Sealable, as QEMU's memory-backend-memfd makes it (seal=on).
  const int fd = memfd_create("accel-mem", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || ftruncate(fd, off_t(size)) != 0) {
    *err = std::string("device memory: ") + std::strerror(errno);
    if (fd >= 0) close(fd);
    return nullptr;
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    *err = std::string("device memory mmap: ") + std::strerror(errno);
    close(fd);
    return nullptr;
  }
  device_mem_.push_back({gpa, size, fd, static_cast<uint8_t*>(p)});
  return static_cast<uint8_t*>(p);
}

bool Frontend::Send(Request r, const void* payload, size_t n, std::string* err, const std::vector<int>& fds,
                    bool ack) {
  Header h{uint32_t(r), kFlagVersion | (ack ? kFlagNeedReply : 0), uint32_t(n)};
  std::vector<uint8_t> buf(sizeof(h) + n);
  std::memcpy(buf.data(), &h, sizeof(h));
  if (n) std::memcpy(buf.data() + sizeof(h), payload, n);
  iovec iov{buf.data(), buf.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  if (sendmsg(sock_, &msg, MSG_NOSIGNAL) != ssize_t(buf.size())) {
    *err = std::string("sendmsg: ") + std::strerror(errno);
    return false;
  }
  if (!ack) return true;
  Message m;
  if (!ReadMessage(sock_, &m, err)) {
    if (err->empty()) *err = "connection closed by vstellard";
    return false;
  }
  uint64_t v = 1;
  if (m.payload.size() == 8) std::memcpy(&v, m.payload.data(), 8);
  if (v != 0) {
    *err = "request " + std::to_string(uint32_t(r)) + " refused";
    return false;
  }
  return true;
}

bool Frontend::Get(Request r, const void* payload, size_t n, std::vector<uint8_t>* reply, std::string* err,
                   const std::vector<int>& fds) {
  if (!Send(r, payload, n, err, fds)) return false;
  Message m;
  if (!ReadMessage(sock_, &m, err)) {
    if (err->empty()) *err = "connection closed by vstellard";
    return false;
  }
  *reply = std::move(m.payload);
  return true;
}

bool Frontend::Alive() {
  pollfd p{sock_, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return true;
  char c;
  return recv(sock_, &c, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

bool Frontend::Connect(const std::string& path, std::string* err, bool mem_table) {
  ram_fd_ = memfd_create("guest-ram", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (ram_fd_ < 0 || ftruncate(ram_fd_, off_t(o_.mem_size)) != 0) {
    *err = std::string("memfd: ") + std::strerror(errno);
    return false;
  }
  void* p = mmap(nullptr, o_.mem_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, ram_fd_, 0);
  if (p == MAP_FAILED) {
    *err = std::string("mmap: ") + std::strerror(errno);
    return false;
  }
  mem_ = static_cast<uint8_t*>(p);
  if (o_.doorbell) {
    std::string name = VSTELLAR_DB_MEMFD_NAME;
    if (o_.db_region_id) name += "-" + std::to_string(o_.db_region_id);
    db_fd_ = memfd_create(name.c_str(), MFD_CLOEXEC | (o_.sealable_doorbell ? MFD_ALLOW_SEALING : 0u));
    if (db_fd_ < 0 || ftruncate(db_fd_, 1 << 16) != 0) {
      *err = "doorbell memfd";
      return false;
    }
    // What the guest process sees after mmap of its doorbell page.
    void* d = mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_SHARED, db_fd_, 0);
    if (d == MAP_FAILED) {
      *err = std::string("doorbell mmap: ") + std::strerror(errno);
      return false;
    }
    db_ = static_cast<uint8_t*>(d);
    db_gpa_ = o_.doorbell_gpa         ? o_.doorbell_gpa
              : o_.mem_size <= 0xfe000000ull ? 0xfe000000ull
                                             : (o_.mem_size + (1ull << 30) - 1) & ~((1ull << 30) - 1);
  }
  return Handshake(path, err, mem_table);
}

void Frontend::Disconnect() {
  if (sock_ >= 0) close(sock_);
  sock_ = -1;
}

bool Frontend::Reconnect(const std::string& path, std::string* err) {
  Disconnect();
  return Handshake(path, err, true);
}

bool Frontend::Handshake(const std::string& path, std::string* err, bool mem_table) {
  sock_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
  if (connect(sock_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    *err = std::string("connect: ") + std::strerror(errno);
    return false;
  }
  std::vector<uint8_t> r;
  if (!Get(Request::kGetFeatures, nullptr, 0, &r, err) || r.size() != 8) return false;
  uint64_t offered;
  std::memcpy(&offered, r.data(), 8);
  features_ = offered & (Bit(kFeatureVersion1) | Bit(kFeatureProtocolFeatures) | Bit(kFeatureIndirectDesc) |
                         0xffffff | (o_.event_idx ? Bit(kFeatureEventIdx) : 0));
  if (!Get(Request::kGetProtocolFeatures, nullptr, 0, &r, err)) return false;
  uint64_t proto = Bit(kProtocolMq) | Bit(kProtocolReplyAck) | Bit(kProtocolConfig);
  if (o_.migratable) proto |= Bit(kProtocolLogShmfd) | Bit(kProtocolResetDevice) | Bit(kProtocolDeviceState);
  if (!Send(Request::kSetProtocolFeatures, &proto, 8, err)) return false;
  if (!Send(Request::kSetFeatures, &features_, 8, err)) return false;
  if (!Send(Request::kSetOwner, nullptr, 0, err, {}, true)) return false;
  if (o_.doorbell && o_.db_region_id) {
    std::vector<uint8_t> c(sizeof(ConfigHeader) + 4);
    const ConfigHeader h{uint32_t(offsetof(virtio_vstellar_config, db_region_id)), 4, 0};
    const uint32_t id = htole32(o_.db_region_id);
    std::memcpy(c.data(), &h, sizeof(h));
    std::memcpy(c.data() + sizeof(h), &id, 4);
    if (!Send(Request::kSetConfig, c.data(), c.size(), err, {}, true)) return false;
  }
  return mem_table ? SendMemTable(err) : true;
}

bool Frontend::SendMemTable(std::string* err) {
  std::vector<uint8_t> p(8);
  std::vector<int> fds;
  auto add = [&](uint64_t gpa, uint64_t size, uint64_t va, int fd) {
    MemRegionDesc d{gpa, size, va, 0};
    const size_t at = p.size();
    p.resize(at + sizeof(d));
    std::memcpy(p.data() + at, &d, sizeof(d));
    fds.push_back(fd);
  };
  add(0, o_.mem_size, kVaBase, ram_fd_);
  for (const Frontend* f : others_) add(f->db_gpa_, 1 << 16, kVaBase + f->db_gpa_, f->db_fd_);
  if (o_.doorbell) add(db_gpa_, 1 << 16, kVaBase + db_gpa_, db_fd_);
  for (const DeviceMemory& m : device_mem_) add(m.gpa, m.size, kVaBase + m.gpa, m.fd);
  const uint32_t n = uint32_t(fds.size());
  std::memcpy(p.data(), &n, 4);
  return Send(Request::kSetMemTable, p.data(), p.size(), err, fds, true);
}

bool Frontend::StartQueue(uint32_t q, uint32_t num, std::string* err) {
  Queue& s = qs_.at(q);
  s = Queue{};
  s.num = num;
  const uint64_t base = RingGpa(q);
  std::memset(mem_ + base, 0, 0x3000);
  VringState st{q, num};
  if (!Send(Request::kSetVringNum, &st, sizeof(st), err, {}, true)) return false;
  st.num = 0;
  if (!Send(Request::kSetVringBase, &st, sizeof(st), err, {}, true)) return false;
  VringAddr a{q, 0, kVaBase + base, kVaBase + base + 0x2000, kVaBase + base + 0x1000, 0};
  if (!Send(Request::kSetVringAddr, &a, sizeof(a), err, {}, true)) return false;
  s.call = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  s.kick = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  uint64_t u = q;
  if (!Send(Request::kSetVringCall, &u, 8, err, {s.call}, true)) return false;
  if (!Send(Request::kSetVringKick, &u, 8, err, {s.kick}, true)) return false;
  st.num = 1;
  return Send(Request::kSetVringEnable, &st, sizeof(st), err, {}, true);
}

bool Frontend::StopQueues(std::string* err) {
  bases_.assign(qs_.size(), 0);
  for (uint32_t q = 0; q < qs_.size(); q++) {
    VringState st{q, 0};
    std::vector<uint8_t> r;
    if (!Get(Request::kGetVringBase, &st, sizeof(st), &r, err)) return false;
    if (r.size() != sizeof(st)) {
      *err = "GET_VRING_BASE: short reply";
      return false;
    }
    std::memcpy(&st, r.data(), sizeof(st));
    bases_[q] = uint16_t(st.num);
  }
  return true;
}

bool Frontend::ResumeQueues(std::string* err) {
  for (uint32_t q = 0; q < qs_.size(); q++) {
    Queue& s = qs_[q];
    const uint64_t base = RingGpa(q);
    VringState st{q, s.num};
    if (!Send(Request::kSetVringNum, &st, sizeof(st), err, {}, true)) return false;
    st.num = q < bases_.size() ? bases_[q] : 0;
    if (!Send(Request::kSetVringBase, &st, sizeof(st), err, {}, true)) return false;
    VringAddr a{q, 0, kVaBase + base, kVaBase + base + 0x2000, kVaBase + base + 0x1000, 0};
    if (!Send(Request::kSetVringAddr, &a, sizeof(a), err, {}, true)) return false;
    uint64_t u = q;
    if (!Send(Request::kSetVringCall, &u, 8, err, {s.call}, true)) return false;
    if (!Send(Request::kSetVringKick, &u, 8, err, {s.kick}, true)) return false;
    st.num = 1;
    if (!Send(Request::kSetVringEnable, &st, sizeof(st), err, {}, true)) return false;
  }
  return true;
}

uint64_t Frontend::TakeCalls(uint32_t q) {
  uint64_t n = 0;
  if (q < qs_.size() && read(qs_[q].call, &n, sizeof(n)) != sizeof(n)) n = 0;
  return n;
}

bool Frontend::TransferState(bool save, std::vector<uint8_t>* bytes, std::string* err) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) {
    *err = std::string("pipe: ") + std::strerror(errno);
    return false;
  }
  const DeviceStateFd d{save ? kStateSave : kStateLoad, 0};
  std::vector<uint8_t> r;
  const bool sent = Get(Request::kSetDeviceStateFd, &d, sizeof(d), &r, err, {save ? p[1] : p[0]});
  close(save ? p[1] : p[0]);
  const int mine = save ? p[0] : p[1];
  uint64_t v = 1;
  if (sent && r.size() == 8) std::memcpy(&v, r.data(), 8);
  if (!sent || (v & 0xff) != 0) {
    close(mine);
    if (sent) *err = "SET_DEVICE_STATE_FD refused";
    return false;
  }
  // As QEMU: read to EOF, or write it all and close; then ask.
  if (save) {
    bytes->clear();
    uint8_t buf[65536];
    ssize_t n;
    while ((n = read(mine, buf, sizeof(buf))) > 0) bytes->insert(bytes->end(), buf, buf + n);
  } else {
    size_t done = 0;
    while (done < bytes->size()) {
      const ssize_t n = write(mine, bytes->data() + done, bytes->size() - done);
      if (n <= 0) break;
      done += size_t(n);
    }
  }
  close(mine);
  if (!Get(Request::kCheckDeviceState, nullptr, 0, &r, err)) return false;
  v = 1;
  if (r.size() == 8) std::memcpy(&v, r.data(), 8);
  if (v != 0) {
    *err = "CHECK_DEVICE_STATE: the device refused";
    return false;
  }
  return true;
}

bool Frontend::StartQueues(std::string* err) {
  for (uint32_t q = 0; q < qs_.size(); q++)
    if (!StartQueue(q, o_.ring_num, err)) return false;
  // Stock the event queue and the CQ notification queues with buffers.
  // Buffers of 32 bytes: a page fault's size (F_ODP), other events use 16.
  for (uint32_t i = 0; i < 8; i++)
    Post(VSTELLAR_VQ_EVENT, {{kEventGpa + kEventBuf * i, kEventBuf, true}}, false);
  Kick(VSTELLAR_VQ_EVENT);
  for (uint32_t q = VSTELLAR_VQ_CQN0; q < qs_.size(); q++) {
    for (uint32_t i = 0; i < 8; i++)
      Post(q, {{kCqnGpa + 0x100 * (q - VSTELLAR_VQ_CQN0) + 8 * i, 8, true}}, false);
    Kick(q);
  }
  return true;
}

uint16_t Frontend::Post(uint32_t q, const std::vector<DescSpec>& chain, bool kick) {
  Queue& s = qs_.at(q);
  const uint64_t base = RingGpa(q);
  // Chains of up to 4 descriptors at (avail * 4) % num: tests keep few in flight.
  const uint16_t head = uint16_t((uint32_t(s.avail) * 4) % s.num);
  for (size_t i = 0; i < chain.size(); i++) {
    const uint16_t idx = uint16_t((head + i) % s.num);
    uint8_t* d = mem_ + base + 16ull * idx;
    const uint64_t addr = htole64(chain[i].gpa);
    const uint32_t len = htole32(chain[i].len);
    const uint16_t flags = htole16((chain[i].write ? kDescWrite : 0) | (i + 1 < chain.size() ? kDescNext : 0));
    const uint16_t next = htole16(uint16_t((idx + 1) % s.num));
    std::memcpy(d, &addr, 8);
    std::memcpy(d + 8, &len, 4);
    std::memcpy(d + 12, &flags, 2);
    std::memcpy(d + 14, &next, 2);
  }
  const uint16_t h = htole16(head);
  std::memcpy(mem_ + base + 0x1000 + 4 + 2ull * (s.avail % s.num), &h, 2);
  std::atomic_thread_fence(std::memory_order_release);
  s.avail++;
  SetAvailIdx(q, s.avail);
  if (kick) Kick(q);
  return head;
}

void Frontend::SetAvailIdx(uint32_t q, uint16_t idx) {
  const uint16_t v = htole16(idx);
  std::atomic_thread_fence(std::memory_order_release);
  std::memcpy(mem_ + RingGpa(q) + 0x1000 + 2, &v, 2);
}

void Frontend::Kick(uint32_t q) {
  uint64_t one = 1;
  (void)!write(qs_.at(q).kick, &one, 8);
}

bool Frontend::WaitUsed(uint32_t q, uint16_t* head, uint32_t* len, int timeout_ms) {
  Queue& s = qs_.at(q);
  const uint64_t base = RingGpa(q);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    uint16_t used;
    std::memcpy(&used, mem_ + base + 0x2000 + 2, 2);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (le16toh(used) != s.used_seen) {
      uint32_t e[2];
      std::memcpy(e, mem_ + base + 0x2000 + 4 + 8ull * (s.used_seen % s.num), 8);
      s.used_seen++;
      *head = uint16_t(le32toh(e[0]));
      *len = le32toh(e[1]);
      return true;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{s.call, POLLIN, 0};
    if (poll(&p, 1, int(std::min<long>(left.count(), 50))) > 0) {
      uint64_t v;
      (void)!read(s.call, &v, 8);
    }
  }
}

CmdResult Frontend::Command(uint16_t op, uint32_t ucontext, const void* body, size_t len, uint32_t resp_len,
                            int timeout_ms) {
  CmdResult r;
  if (len > kReqMax - sizeof(vstellar_cmd_hdr)) return r;
  vstellar_cmd_hdr h{};
  h.opcode = htole16(op);
  h.cmd_id = htole32(cmd_id_++);
  h.ucontext = htole32(ucontext);
  h.length = htole32(uint32_t(len));
  std::memcpy(mem_ + kReqGpa, &h, sizeof(h));
  if (len) std::memcpy(mem_ + kReqGpa + sizeof(h), body, len);
  std::memset(mem_ + kRespGpa, 0xee, sizeof(vstellar_resp_hdr) + resp_len);
  Post(VSTELLAR_VQ_CONTROL,
       {{kReqGpa, uint32_t(sizeof(h) + len), false}, {kRespGpa, uint32_t(sizeof(vstellar_resp_hdr) + resp_len), true}});
  uint16_t head;
  if (!WaitUsed(VSTELLAR_VQ_CONTROL, &head, &r.used_len, timeout_ms)) return r;
  r.done = true;
  if (r.used_len >= sizeof(r.hdr)) {
    std::memcpy(&r.hdr, mem_ + kRespGpa, sizeof(r.hdr));
    r.hdr.opcode = le16toh(r.hdr.opcode);
    r.hdr.status = le16toh(r.hdr.status);
    r.hdr.cmd_id = le32toh(r.hdr.cmd_id);
    r.hdr.length = le32toh(r.hdr.length);
    const uint32_t n = std::min<uint32_t>(r.hdr.length, r.used_len - uint32_t(sizeof(r.hdr)));
    r.body.assign(mem_ + kRespGpa + sizeof(r.hdr), mem_ + kRespGpa + sizeof(r.hdr) + n);
  } else {
    r.hdr.status = 0xffff;
  }
  return r;
}

std::vector<vstellar_event> Frontend::Events(int timeout_ms, std::vector<vstellar_event_page_fault>* faults) {
  std::vector<vstellar_event> v;
  uint16_t head;
  uint32_t len;
  while (WaitUsed(VSTELLAR_VQ_EVENT, &head, &len, timeout_ms)) {
    // Buffers were posted one descriptor each at head = i*4 % num for i-th post.
    const uint32_t i = head / 4;
    vstellar_event e;
    std::memcpy(&e, mem_ + kEventGpa + kEventBuf * i, sizeof(e));
    v.push_back(e);
    if (faults && le16toh(e.type) == VSTELLAR_EV_PAGE_FAULT && len == sizeof(vstellar_event_page_fault)) {
      vstellar_event_page_fault pf;
      std::memcpy(&pf, mem_ + kEventGpa + kEventBuf * i, sizeof(pf));
      faults->push_back(pf);
    }
    // Give the queue a buffer back (at the slot its next head maps to).
    const Queue& s = qs_.at(VSTELLAR_VQ_EVENT);
    const uint32_t next = ((uint32_t(s.avail) * 4) % s.num) / 4;
    Post(VSTELLAR_VQ_EVENT, {{kEventGpa + kEventBuf * next, kEventBuf, true}});
    timeout_ms = 0;
  }
  return v;
}

}  // namespace vstellard
