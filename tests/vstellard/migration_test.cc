// Live migration of a device (docs/virtio-vstellar.md, "Live migration"):
// the dirty log, the device stopped and started by its rings, RESET_DEVICE,
// and the state saved from one connection and loaded into another while
// its QPs keep running against a peer that never stopped.
#include <endian.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <thread>

#include "vstellard/datapath_fixture.h"
#include "vstellard/dirty_log.h"

namespace vstellard::datapath_test {
namespace {

bool LogBit(const uint8_t* log, uint64_t page) { return (log[page / 8] >> (page % 8)) & 1; }

// An engine counter of the daemon's statistics (its "engine" object).
uint64_t EngineCounter(const std::string& json, const char* name) {
  std::smatch m;
  const std::regex re(std::string("\"") + name + "\":([0-9]+)");
  return std::regex_search(json, m, re) ? std::stoull(m[1]) : 0;
}

TEST(DirtyLog, MarksThePagesWrittenAndAgainAfterQemuTookThem) {
  const int fd = memfd_create("log", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  auto* bits = static_cast<uint8_t*>(mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(bits, MAP_FAILED);
  DirtyLog log;
  log.Mark(0x5000, 8);  // nothing: no log yet
  std::string err;
  // The bitmap at offset 4096 of the file, 64 bytes: 512 pages.
  ASSERT_TRUE(log.Map(Fd(dup(fd)), 64, 4096, &err)) << err;
  log.Mark(0x5000, 8);
  EXPECT_FALSE(LogBit(bits + 4096, 5)) << "logging is off until VHOST_F_LOG_ALL";
  log.SetLogging(true);
  log.Mark(0x5000, 8);
  log.Mark(0x6ff0, 0x20);  // across two pages
  EXPECT_TRUE(LogBit(bits + 4096, 5));
  EXPECT_TRUE(LogBit(bits + 4096, 6));
  EXPECT_TRUE(LogBit(bits + 4096, 7));
  EXPECT_FALSE(LogBit(bits + 4096, 8));
  EXPECT_EQ(bits[0], 0) << "nothing before the offset";
  log.Mark(512ull << 12, 1);  // page 512: past the bitmap
  EXPECT_EQ(log.beyond(), 1u);
  // A translator marks before the engine writes; QEMU may take the bit in
  // between; the next Flush (the daemon's next turn) sets it again.
  log.MarkBefore(0x20000, 4096);
  EXPECT_TRUE(LogBit(bits + 4096, 0x20));
  bits[4096 + 0x20 / 8] = 0;  // QEMU's sync
  log.Flush();
  EXPECT_TRUE(LogBit(bits + 4096, 0x20));
  bits[4096 + 0x20 / 8] = 0;
  log.Flush();
  EXPECT_FALSE(LogBit(bits + 4096, 0x20)) << "once is enough";
  EXPECT_FALSE(log.Map(Fd(dup(fd)), 0, 0, &err));
  munmap(bits, 8192);
  close(fd);
}

class Migration : public DataPath {
 protected:
  // Device A through a frontend that migrates as QEMU does; device B an
  // ordinary one; each with a context, PD, CQ and MR, and one RC QP
  // connected to the other's.
  void SetUpPair() {
    StartDaemon();
    FrontendOptions mig;
    mig.migratable = true;
    fa_ = std::make_unique<Frontend>(mig);
    fb_ = std::make_unique<Frontend>();
    std::string err;
    for (auto* f : {fa_.get(), fb_.get()}) {
      ASSERT_TRUE(f->Connect(sock_, &err)) << err;
      ASSERT_TRUE(f->StartQueues(&err)) << err;
    }
    a_ = std::make_unique<Guest>(Guest{*fa_});
    b_ = std::make_unique<Guest>(Guest{*fb_});
    a_->Setup();
    b_->Setup();
    qa_ = a_->CreateQp();
    qb_ = b_->CreateQp();
    a_->Connect(qa_, qb_.qpn);
    b_->Connect(qb_, qa_.qpn);
    a_id_ = d_->Stats().front().id;
  }
  // A WRITE of `len` bytes (pattern `seed`) from one guest's MR to the
  // other's, signaled.
  static void Write(Guest& from, GQp& q, Guest& to, uint64_t off, uint32_t len, uint8_t seed, uint64_t wr_id) {
    Fill(from.Buf(off), len, seed);
    auto w = Wqe(VSTELLAR_WR_RDMA_WRITE, wr_id);
    w.u.rdma.remote_addr = kMrGpa + off;
    w.u.rdma.rkey = to.rkey;
    from.PostSend(q, w, {from.Sge(off, len)});
  }
  // A migration of device A with its rings stopped: its state out, its
  // connection closed, a new one (the destination QEMU, same guest memory)
  // loading the state; the rings start again with ResumeQueues.
  void MoveA() {
    std::string err;
    std::vector<uint8_t> state;
    ASSERT_TRUE(fa_->TransferState(true, &state, &err)) << err;
    fa_->Disconnect();
    CloseA();
    ASSERT_TRUE(fa_->Reconnect(sock_, &err)) << err;
    ASSERT_TRUE(fa_->TransferState(false, &state, &err)) << err;
  }
  // Device A's connection closed, and the daemon done with it.
  void CloseA() {
    for (int i = 0; i < 500; i++) {
      if (d_->WorkerOf(a_id_) < 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    FAIL() << "the daemon did not close device " << a_id_;
  }
  GQp qa_, qb_, qa2_, qb2_;
  unsigned a_id_ = 0;
};

// The whole round: A stops with work in flight both ways, its state goes
// out, its connection closes, a new connection (the destination QEMU,
// same guest memory) loads the state and starts the rings from where they
// stopped; every WR completes once, the data is intact, and the QP goes
// on working.
TEST_F(Migration, MigratedDeviceKeepsItsQpsRunning) {
  SetUpPair();
  Guest& A = *a_;
  Guest& B = *b_;
  Write(A, qa_, B, 0, 20000, 1, 1);
  auto c = A.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  EXPECT_EQ(std::memcmp(A.Buf(0), B.Buf(0), 20000), 0);

  // A second pair of QPs, not yet connected: the state holds two QPs.
  qa2_ = A.CreateQp();
  qb2_ = B.CreateQp();
  std::string err;
  ASSERT_TRUE(fa_->StopQueues(&err)) << err;
  // While A is stopped: B writes into A's memory and sends to it (A had a
  // receive posted), and A's guest posts a WRITE (its doorbell rings, the
  // device is stopped).
  A.PostRecv(qa_, 0xa7, {A.Sge(65536, 4096)}, ~0u, /*kick=*/false);
  Write(B, qb_, A, 32768, 30000, 2, 2);
  Fill(B.Buf(100000), 3000, 3);
  B.PostSend(qb_, Wqe(VSTELLAR_WR_SEND, 3), {B.Sge(100000, 3000)});
  Write(A, qa_, B, 70000, 9000, 4, 5);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(B.Poll(0)) << "a stopped device acknowledged something";

  std::vector<uint8_t> state;
  ASSERT_TRUE(fa_->TransferState(true, &state, &err)) << err;
  EXPECT_GT(state.size(), 100u);
  fa_->Disconnect();
  CloseA();
  ASSERT_TRUE(fa_->Reconnect(sock_, &err)) << err;
  ASSERT_TRUE(fa_->TransferState(false, &state, &err)) << err;
  for (uint32_t q = 0; q < VSTELLAR_VQ_CQN0 + 1; q++) fa_->TakeCalls(q);
  ASSERT_TRUE(fa_->ResumeQueues(&err)) << err;
  // Every queue is interrupted once as it starts after the stop: an
  // interrupt raised just before the stop went to the source QEMU.
  for (uint32_t q = 0; q < VSTELLAR_VQ_CQN0 + 1; q++) EXPECT_GE(fa_->TakeCalls(q), 1u) << "queue " << q;

  // A told B it paused and that it runs again (B heard both).
  EXPECT_GE(EngineCounter(d_->StatsJson(), "paused_sent"), 1u);
  EXPECT_GE(EngineCounter(d_->StatsJson(), "resumed_sent"), 1u);
  // B's WRITE and SEND complete, A's WRITE and receive too.
  std::map<uint64_t, uint8_t> done;
  for (int i = 0; i < 2; i++) {
    auto cb = B.Poll(10000);
    ASSERT_TRUE(cb) << "B's work did not complete after the migration";
    done[cb->wr_id] = cb->status;
  }
  EXPECT_EQ(done, (std::map<uint64_t, uint8_t>{{2, 0}, {3, 0}}));
  done.clear();
  for (int i = 0; i < 2; i++) {
    auto ca = A.Poll(10000);
    ASSERT_TRUE(ca) << "A's work did not complete after the migration";
    done[ca->wr_id] = ca->status;
  }
  EXPECT_EQ(done, (std::map<uint64_t, uint8_t>{{0xa7, 0}, {5, 0}}));
  EXPECT_EQ(std::memcmp(A.Buf(32768), B.Buf(32768), 30000), 0);
  EXPECT_EQ(std::memcmp(A.Buf(65536), B.Buf(100000), 3000), 0);
  EXPECT_EQ(std::memcmp(A.Buf(70000), B.Buf(70000), 9000), 0);
  EXPECT_FALSE(A.Poll(100)) << "a completion twice";
  EXPECT_FALSE(B.Poll(0)) << "a completion twice";
  // The second QP pair, made before the stop, works too (a state of
  // several QPs).
  A.Connect(qa2_, qb2_.qpn);
  B.Connect(qb2_, qa2_.qpn);
  Write(A, qa2_, B, 8192, 5000, 12, 77);
  auto c2 = A.Poll();
  ASSERT_TRUE(c2);
  EXPECT_EQ(c2->wr_id, 77u);
  EXPECT_EQ(c2->status, 0);
  // And on.
  for (uint64_t i = 0; i < 20; i++) {
    Write(A, qa_, B, 4096 * (i % 8), 4096, uint8_t(10 + i), 100 + i);
    auto ca = A.Poll();
    ASSERT_TRUE(ca);
    EXPECT_EQ(ca->status, 0);
    EXPECT_EQ(ca->wr_id, 100 + i);
  }
  EXPECT_EQ(A.QpState(qa_.qpn), VSTELLAR_QPS_RTS);
}

// A migration that fails after the stop (the destination refused, or it
// was cancelled): QEMU starts the same rings again and the device goes on
// from where it stopped.
TEST_F(Migration, StoppedDeviceGoesOnWhenItsRingsStartAgain) {
  SetUpPair();
  Guest& A = *a_;
  Guest& B = *b_;
  std::string err;
  ASSERT_TRUE(fa_->StopQueues(&err)) << err;
  Write(B, qb_, A, 0, 50000, 7, 1);
  std::vector<uint8_t> state;
  ASSERT_TRUE(fa_->TransferState(true, &state, &err)) << err;
  ASSERT_TRUE(fa_->ResumeQueues(&err)) << err;
  auto cb = B.Poll(10000);
  ASSERT_TRUE(cb);
  EXPECT_EQ(cb->status, 0);
  EXPECT_EQ(std::memcmp(A.Buf(0), B.Buf(0), 50000), 0);
  Write(A, qa_, B, 0, 1000, 8, 2);
  auto ca = A.Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->status, 0);
}

// A stop longer than the peer's retry limit (retry_cnt 7, timeout 14:
// 8 x 67 ms): the stopped device told its peer it pauses (PAUSED), so the
// peer's WRITE waits instead of failing, and goes through when the device
// says it runs again (RESUMED).
TEST_F(Migration, PeerWaitsThroughALongStop) {
  SetUpPair();
  Guest& A = *a_;
  Guest& B = *b_;
  std::string err;
  ASSERT_TRUE(fa_->StopQueues(&err)) << err;
  Write(B, qb_, A, 0, 40000, 3, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  EXPECT_FALSE(B.Poll(0)) << "the peer gave up or completed against a stopped device";
  ASSERT_TRUE(fa_->ResumeQueues(&err)) << err;
  auto cb = B.Poll(10000);
  ASSERT_TRUE(cb);
  EXPECT_EQ(cb->status, 0);
  EXPECT_EQ(std::memcmp(A.Buf(0), B.Buf(0), 40000), 0);
}

// The process's open files and mappings, and the memory the daemon's
// devices have charged.
struct Footprint {
  size_t fds = 0, maps = 0;
  uint64_t charged = 0;
  bool operator==(const Footprint& o) const { return fds == o.fds && maps == o.maps && charged == o.charged; }
};
std::ostream& operator<<(std::ostream& os, const Footprint& f) {
  return os << f.fds << " fds, " << f.maps << " mappings, " << f.charged << " bytes charged";
}
Footprint Measure(Daemon& d) {
  Footprint f;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) f.fds++;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) f.maps++;
  for (const DeviceStats& s : d.Stats()) f.charged += s.memory;
  return f;
}

// Back and forth ten times (the destination is the same daemon, as when a
// guest comes back to its host), with a WRITE in flight each time: every
// round leaves the daemon as the first did: the same open files, the same
// mappings, the same memory charged (a restored object is charged what
// its CREATE charged, from what it is, not from what the source said).
TEST_F(Migration, TenRoundTripsLeakNothing) {
  SetUpPair();
  Guest& A = *a_;
  Guest& B = *b_;
  std::string err;
  const uint64_t before = [&] {
    uint64_t n = 0;
    for (const DeviceStats& s : d_->Stats()) n += s.memory;
    return n;
  }();
  unsigned b_id = 0;
  for (const DeviceStats& s : d_->Stats())
    if (s.id != a_id_) b_id = s.id;
  Footprint first;
  for (int round = 0; round < 10; round++) {
    SCOPED_TRACE(round);
    ASSERT_TRUE(fa_->StopQueues(&err)) << err;
    Write(B, qb_, A, 0, 30000, uint8_t(round), 1000 + round);
    MoveA();
    if (HasFatalFailure()) return;
    ASSERT_TRUE(fa_->ResumeQueues(&err)) << err;
    for (const DeviceStats& s : d_->Stats())
      if (s.id != b_id) a_id_ = s.id;
    auto cb = B.Poll(10000);
    ASSERT_TRUE(cb);
    EXPECT_EQ(cb->status, 0);
    EXPECT_EQ(cb->wr_id, uint64_t(1000 + round));
    EXPECT_EQ(std::memcmp(A.Buf(0), B.Buf(0), 30000), 0);
    Write(A, qa_, B, 40000, 5000, uint8_t(100 + round), 2000 + round);
    auto ca = A.Poll();
    ASSERT_TRUE(ca);
    EXPECT_EQ(ca->status, 0);
    const Footprint now = Measure(*d_);
    EXPECT_EQ(now.charged, before) << "the restored objects are charged otherwise than when they were made";
    if (round == 0)
      first = now;
    else
      EXPECT_EQ(now, first);
  }
}

// What a destination refuses, with the device untouched: a state that is
// not one, one cut short or changed, one for a device already in use.
TEST_F(Migration, BadStatesAreRefusedAndChangeNothing) {
  SetUpPair();
  std::string err;
  ASSERT_TRUE(fa_->StopQueues(&err)) << err;
  std::vector<uint8_t> state;
  ASSERT_TRUE(fa_->TransferState(true, &state, &err)) << err;
  ASSERT_TRUE(fa_->ResumeQueues(&err)) << err;

  // A fresh device (a second migratable frontend) takes none of these.
  FrontendOptions mig;
  mig.migratable = true;
  Frontend fc(mig);
  ASSERT_TRUE(fc.Connect(sock_, &err)) << err;
  std::vector<uint8_t> junk(1000, 0x5a);
  EXPECT_FALSE(fc.TransferState(false, &junk, &err));
  std::vector<uint8_t> cut(state.begin(), state.begin() + state.size() / 2);
  EXPECT_FALSE(fc.TransferState(false, &cut, &err));
  std::vector<uint8_t> bad = state;
  bad[12] ^= 0xff;  // the config's first byte: another interface version
  EXPECT_FALSE(fc.TransferState(false, &bad, &err));
  // The source still has its QPs: the same numbers cannot be taken.
  EXPECT_FALSE(fc.TransferState(false, &state, &err));
  EXPECT_TRUE(fc.Alive());
  // A device in use takes no state either.
  EXPECT_FALSE(fa_->TransferState(false, &state, &err));
  EXPECT_TRUE(fa_->Alive());

  // A is still fine.
  Write(*a_, qa_, *b_, 0, 3000, 9, 3);
  auto ca = a_->Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->status, 0);
}

// A destination fed every prefix of a real state and hundreds of states
// with a byte changed: each is refused or taken (a changed wr_id is still a
// state), never does the daemon fall over, and what was taken goes away
// with RESET_DEVICE.
TEST_F(Migration, CorruptStatesNeverHurtTheDaemon) {
  SetUpPair();
  std::string err;
  ASSERT_TRUE(fa_->StopQueues(&err)) << err;
  std::vector<uint8_t> state;
  ASSERT_TRUE(fa_->TransferState(true, &state, &err)) << err;
  fa_->Disconnect();
  CloseA();
  FrontendOptions mig;
  mig.migratable = true;
  Frontend fc(mig);
  ASSERT_TRUE(fc.Connect(sock_, &err)) << err;
  int taken = 0;
  auto feed = [&](std::vector<uint8_t> s) {
    if (fc.TransferState(false, &s, &err)) {
      taken++;
      ASSERT_TRUE(fc.Send(Request::kResetDevice, nullptr, 0, &err, {}, true)) << err;
    }
    ASSERT_TRUE(fc.Alive()) << "a state ended the connection";
  };
  for (size_t n = 0; n < state.size(); n += 13) feed(std::vector<uint8_t>(state.begin(), state.begin() + n));
  std::mt19937 rng(7);
  for (int i = 0; i < 400; i++) {
    std::vector<uint8_t> s = state;
    s[rng() % s.size()] ^= uint8_t(1 + rng() % 255);
    feed(std::move(s));
  }
  feed(state);  // and the real one, last
  EXPECT_GE(taken, 1);
  // The daemon still serves devices.
  Frontend fd;
  ASSERT_TRUE(fd.Connect(sock_, &err)) << err;
  ASSERT_TRUE(fd.StartQueues(&err)) << err;
  Guest G{fd};
  G.Setup();
}

// With RESET_DEVICE negotiated, GET_VRING_BASE stops and RESET_DEVICE
// resets: the objects are gone.
TEST_F(Migration, ResetDeviceDestroysTheObjects) {
  SetUpPair();
  std::string err;
  ASSERT_TRUE(fa_->StopQueues(&err)) << err;
  ASSERT_TRUE(fa_->Send(Request::kResetDevice, nullptr, 0, &err, {}, true)) << err;
  ASSERT_TRUE(fa_->ResumeQueues(&err)) << err;
  EXPECT_EQ(a_->QpState(qa_.qpn), 0xff) << "the QP survived a reset";
}

// A UD QP in a multicast group migrates with its membership: at the stop
// the device leaves the group (the membership is its engine's link's), a
// migration that fails starts it again in the group, and the destination
// joins it again as it loads the state. Datagrams to the group reach the
// QP after each, and the guest can leave the group afterwards.
TEST_F(Migration, MulticastMembershipMovesWithTheDevice) {
  SetUpPair();
  Guest& A = *a_;
  Guest& B = *b_;
  GQp ua, ub;
  ASSERT_NO_FATAL_FAILURE(A.CreateUdQp(0x4242, &ua));
  ASSERT_NO_FATAL_FAILURE(B.CreateUdQp(0x4242, &ub));
  B.AddLoopbackGid(1);
  vstellar_cmd_mcast m{};
  m.qpn = ua.qpn;
  m.mgid[10] = m.mgid[11] = 0xff;
  m.mgid[12] = 230, m.mgid[13] = 9, m.mgid[14] = 8, m.mgid[15] = 7;
  ASSERT_EQ(A.Cmd(VSTELLAR_CMD_ATTACH_MCAST, &m, sizeof(m), 0).status(), 0);
  vstellar_send_wqe w = UdWqe(0x11, 1, 0xffffff, 0x4242);
  std::memcpy(w.u.ud.av.dgid + 12, m.mgid + 12, 4);
  // B sends to the group; A's QP gets it, the payload after the GRH.
  auto datagram = [&](uint64_t wr_id, uint8_t seed) {
    Fetched(a_id_, [&] { A.PostRecv(ua, wr_id, {A.Sge(0, 512)}); });
    Fill(B.Buf(4096), 200, seed);
    B.PostSend(ub, w, {B.Sge(4096, 200)});
    auto cb = B.Poll();
    ASSERT_TRUE(cb);
    EXPECT_EQ(cb->status, 0);
    auto ca = A.Poll();
    ASSERT_TRUE(ca) << "the group's datagram did not reach the QP";
    EXPECT_EQ(ca->wr_id, wr_id);
    EXPECT_EQ(ca->status, 0);
    EXPECT_EQ(ca->byte_len, VSTELLAR_GRH_BYTES + 200);
    EXPECT_EQ(std::memcmp(A.Buf(VSTELLAR_GRH_BYTES), B.Buf(4096), 200), 0);
  };
  datagram(1, 1);

  // A migration that fails: the device starts again at the source, in the group.
  std::string err;
  ASSERT_TRUE(fa_->StopQueues(&err)) << err;
  std::vector<uint8_t> state;
  ASSERT_TRUE(fa_->TransferState(true, &state, &err)) << err;
  ASSERT_TRUE(fa_->ResumeQueues(&err)) << err;
  datagram(2, 2);

  // One that succeeds: the destination's device is in the group.
  ASSERT_TRUE(fa_->StopQueues(&err)) << err;
  MoveA();
  if (HasFatalFailure()) return;
  ASSERT_TRUE(fa_->ResumeQueues(&err)) << err;
  for (const DeviceStats& s : d_->Stats()) a_id_ = std::max(a_id_, s.id);  // A's new connection
  datagram(3, 3);
  // The device's table and the engine agree: A leaves the group once.
  EXPECT_EQ(A.Cmd(VSTELLAR_CMD_DETACH_MCAST, &m, sizeof(m), 0).status(), 0);
  EXPECT_EQ(A.Cmd(VSTELLAR_CMD_DETACH_MCAST, &m, sizeof(m), 0).status(), VSTELLAR_STATUS_BAD_FIELD);
}

// While QEMU logs (SET_LOG_BASE, VHOST_F_LOG_ALL), every page the device
// writes into guest memory is marked: data a peer WRITEs, the CQE ring,
// the used rings.
TEST_F(Migration, DirtyLogHasEveryPageTheDeviceWrote) {
  SetUpPair();
  const int fd = memfd_create("log", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  const uint64_t pages = fa_->mem_size() >> 12;
  ASSERT_EQ(ftruncate(fd, off_t(pages / 8)), 0);
  auto* bits = static_cast<uint8_t*>(mmap(nullptr, pages / 8, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(bits, MAP_FAILED);
  std::string err;
  const LogBase lb{pages / 8, 0};
  std::vector<uint8_t> reply;
  ASSERT_TRUE(fa_->Get(Request::kSetLogBase, &lb, sizeof(lb), &reply, &err, {fd})) << err;
  // QEMU turns logging on with SET_FEATURES (and the rings' addresses
  // again with the log flag; a running ring takes that).
  const uint64_t acked = fa_->features() | (uint64_t{1} << kFeatureLogAll);
  ASSERT_TRUE(fa_->Send(Request::kSetFeatures, &acked, 8, &err, {}, true)) << err;
  Write(*b_, qb_, *a_, 0x8000, 3 * 4096, 5, 1);
  auto cb = b_->Poll();
  ASSERT_TRUE(cb);
  EXPECT_EQ(cb->status, 0);
  b_->PostRecv(qb_, 9, {b_->Sge(0, 64)});
  Write(*a_, qa_, *b_, 0, 100, 6, 2);
  auto ca = a_->Poll();
  ASSERT_TRUE(ca);
  for (uint64_t p = (kMrGpa + 0x8000) >> 12; p < (kMrGpa + 0x8000 + 3 * 4096) >> 12; p++)
    EXPECT_TRUE(LogBit(bits, p)) << "page " << p << " of the peer's WRITE";
  EXPECT_TRUE(LogBit(bits, kCqGpa >> 12)) << "the CQE ring";
  EXPECT_FALSE(LogBit(bits, (kMrGpa + 0x10000) >> 12)) << "a page nobody wrote";
  munmap(bits, pages / 8);
  close(fd);
}

}  // namespace
}  // namespace vstellard::datapath_test
