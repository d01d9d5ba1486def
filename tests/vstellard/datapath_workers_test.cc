// Worker threads: one and two workers give the same results, and daemons
// with one and two workers interoperate.
#include <gtest/gtest.h>

#include <array>

#include "vstellard/datapath_fixture.h"

namespace vstellard::datapath_test {

// Two QP pairs (four devices) moving data at once: WRITE, SEND and READ of
// several packets each. One worker thread and two (where each pair talks
// across the threads and every QPN names its worker) give the same
// completions and the same bytes.
std::vector<uint64_t> DataPath::TwoQpPairsRun() {
  std::vector<uint64_t> out;
  std::vector<std::unique_ptr<Frontend>> fs;
  std::vector<std::unique_ptr<Guest>> gs;
  std::vector<GQp> qs;
  const unsigned first = AttachGuests(4, &fs, &gs);
  for (auto& g : gs) qs.push_back(g->CreateQp());
  for (int i = 0; i < 4; i++) {
    // Devices alternate between the workers; a QP's number names its own.
    EXPECT_EQ(d_->WorkerOf(first + unsigned(i)), int(unsigned(i) % threads_)) << i;
    EXPECT_EQ(qs[i].qpn % threads_, unsigned(i) % threads_) << i;
  }
  for (int i = 0; i < 4; i += 2) {
    gs[i]->Connect(qs[i], qs[i + 1].qpn);
    gs[i + 1]->Connect(qs[i + 1], qs[i].qpn);
  }
  if (threads_ > 1 && d_->device_moves()) {
    // Placed by peers: each pair meets on one worker, the pairs on two.
    std::vector<int> w(4);
    for (int i = 0; i < 4; i++) w[i] = WaitForWorker(first + unsigned(i));
    EXPECT_EQ(w[0], w[1]);
    EXPECT_EQ(w[2], w[3]);
    EXPECT_NE(w[0], w[2]);
  }
  for (int i = 0; i < 4; i += 2) {
    Guest& a = *gs[i];
    Guest& b = *gs[i + 1];
    Fill(a.Buf(0), 65536, uint8_t(i + 1));
    std::memset(b.Buf(0), 0, kMrLen);
    b.PostRecv(qs[i + 1], 7, {b.Sge(65536, 16384)});
    vstellar_send_wqe w = Wqe(VSTELLAR_WR_RDMA_WRITE, 1);
    w.u.rdma.remote_addr = kMrGpa;
    w.u.rdma.rkey = b.rkey;
    a.PostSend(qs[i], w, {a.Sge(0, 49152)});
    a.PostSend(qs[i], Wqe(VSTELLAR_WR_SEND, 2), {a.Sge(4096, 12000)});
    w = Wqe(VSTELLAR_WR_RDMA_READ, 3);
    w.u.rdma.remote_addr = kMrGpa + 1000;
    w.u.rdma.rkey = a.rkey;
    b.PostSend(qs[i + 1], w, {b.Sge(98304, 30000)});
  }
  for (int i = 0; i < 4; i++) {
    // Even: WRITE, SEND (in order); odd: RECV and READ, in either order
    // (two queues).
    std::vector<std::array<uint64_t, 4>> cs;
    for (int k = 0; k < 2; k++) {
      auto c = gs[i]->Poll();
      EXPECT_TRUE(c) << i;
      if (!c) return out;
      cs.push_back({uint64_t(c->wr_id), uint64_t(c->status), uint64_t(c->opcode), uint64_t(c->byte_len)});
    }
    std::sort(cs.begin(), cs.end());
    for (auto& c : cs) out.insert(out.end(), c.begin(), c.end());
  }
  for (int i = 0; i < 4; i++) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a of the whole MR
    for (uint64_t k = 0; k < kMrLen; k++) h = (h ^ gs[i]->Buf(0)[k]) * 1099511628211ull;
    out.push_back(h);
  }
  for (int i = 0; i < 4; i += 2) {
    EXPECT_EQ(std::memcmp(gs[i + 1]->Buf(0), gs[i]->Buf(0), 49152), 0) << i;
    EXPECT_EQ(std::memcmp(gs[i + 1]->Buf(65536), gs[i]->Buf(4096), 12000), 0) << i;
    EXPECT_EQ(std::memcmp(gs[i + 1]->Buf(98304), gs[i]->Buf(1000), 30000), 0) << i;
  }
  return out;
}

// Also with integrity on two workers, with each MAC (DaemonOptions::
// integrity_alg; GMAC where the CPU has AES-NI and PCLMUL): the MAC prefix
// in front of every packet means both the kernel's steering and the
// workers' router must find the destination QPN behind it
// (wire::route_key, wire::dst_qpn_offset); a datagram given to a worker
// whose engine lacks its QP would be dropped and the run would not complete.
TEST_F(DataPath, TwoQpPairsGiveTheSameResultsOnOneAndTwoThreads) {
  using Alg = vstellar::EngineConfig::MacAlgorithm;
  struct Run {
    unsigned threads;
    bool integrity;
    Alg alg = Alg::CHACHA20_POLY1305;
    bool place_by_peers = true;
  };
  // Two workers with placement by peers (a device of each pair moves to
  // the other's worker) and without (every packet crosses the threads).
  std::vector<Run> runs = {Run{1, false}, Run{2, false}, Run{2, false, Alg::CHACHA20_POLY1305, false}, Run{2, true}};
  if (__builtin_cpu_supports("aes") && __builtin_cpu_supports("pclmul")) runs.push_back(Run{2, true, Alg::AES_GMAC});
  std::vector<std::vector<uint64_t>> results;
  for (const Run run : runs) {
    SCOPED_TRACE(testing::Message() << run.threads << " workers, integrity " << run.integrity << ", MAC "
                                    << int(run.alg));
    threads_ = run.threads;
    StartDaemon(50, {}, [&](DaemonOptions& o) {
      o.place_by_peers = run.place_by_peers;
      o.integrity = run.integrity;
      o.integrity_alg = run.alg;
      for (size_t i = 0; i < o.integrity_key.size(); i++) o.integrity_key[i] = uint8_t(7 * i + 1);
    });
    results.push_back(TwoQpPairsRun());
    // Each pair ends on one worker, the two pairs on different ones.
    if (run.threads > 1) {
      EXPECT_EQ(d_->device_moves(), run.place_by_peers ? 2u : 0u);
    }
    TearDown();
    d_.reset();
    sock_.clear();
    dir_.clear();
  }
  EXPECT_EQ(results[0].size(), 4u * 2 * 4 + 4);
  for (size_t i = 1; i < results.size(); i++) EXPECT_EQ(results[0], results[i]) << i;
}

// A daemon with two workers and one with one, on two ports of one host:
// each sends to the other's one base port (--peer-port) as always, and the
// two-worker daemon's kernel steering finds the QP's worker. Pairs: device
// k of one with device k of the other (k = 0, 1: both workers).
TEST_F(DataPath, DaemonsWithOneAndTwoThreadsInteroperate) {
  // Below 45000, as in datapath_fixture.h (guest tests' daemons use 47000).
  const uint16_t pa = uint16_t(20000 + (getpid() * 37 + 17) % 24000), pb = uint16_t(pa + 600);
  threads_ = 2;
  StartDaemon(50, {}, [&](DaemonOptions& o) {
    o.udp_port = pa;
    o.peer_port = pb;
  });
  DaemonOptions ob;
  ob.socket = dir_ + "/b";
  ob.udp_port = pb;
  ob.peer_port = pa;
  ob.paths = 4;
  auto bp = std::make_unique<Daemon>(ob);
  Daemon& b = *bp;
  std::promise<std::string> started;
  auto fut = started.get_future();
  std::promise<void> release;
  std::thread tb([&, released = release.get_future()] {
    // Start(), Run() and the destructor on the daemon's own thread (its
    // io_uring is single-issuer).
    std::string err;
    const bool ok = b.Start(&err);
    started.set_value(ok ? "" : err);
    if (ok) {
      b.Run();
      released.wait();
    }
    bp.reset();
  });
  const std::string err = fut.get();
  if (!err.empty()) {
    tb.join();
    FAIL() << err;
  }
  std::vector<std::unique_ptr<Frontend>> fs;
  std::vector<std::unique_ptr<Guest>> gs;
  std::vector<GQp> qs;
  for (const std::string& sock : {sock_, sock_, ob.socket, ob.socket}) {  // A0, A1, B0, B1
    fs.push_back(std::make_unique<Frontend>());
    std::string e;
    ASSERT_TRUE(fs.back()->Connect(sock, &e)) << e;
    ASSERT_TRUE(fs.back()->StartQueues(&e)) << e;
    gs.push_back(std::make_unique<Guest>(Guest{*fs.back()}));
    gs.back()->Setup();
    qs.push_back(gs.back()->CreateQp());
  }
  EXPECT_NE(qs[0].qpn % 2, qs[1].qpn % 2);  // one QP on each worker of A
  for (int k = 0; k < 2; k++) {
    gs[k]->Connect(qs[k], qs[k + 2].qpn);
    gs[k + 2]->Connect(qs[k + 2], qs[k].qpn);
  }
  for (int k = 0; k < 2; k++) {
    Guest& a = *gs[k];
    Guest& bg = *gs[k + 2];
    Fill(a.Buf(0), 40000, uint8_t(3 + k));
    Fill(bg.Buf(65536), 30000, uint8_t(9 + k));
    vstellar_send_wqe w = Wqe(VSTELLAR_WR_RDMA_WRITE, 1);
    w.u.rdma.remote_addr = kMrGpa;
    w.u.rdma.rkey = bg.rkey;
    a.PostSend(qs[k], w, {a.Sge(0, 40000)});  // A -> B
    w = Wqe(VSTELLAR_WR_RDMA_WRITE, 2);
    w.u.rdma.remote_addr = kMrGpa + 65536;
    w.u.rdma.rkey = a.rkey;
    bg.PostSend(qs[k + 2], w, {bg.Sge(65536, 30000)});  // B -> A
  }
  for (int k = 0; k < 4; k++) {
    auto c = gs[k]->Poll();
    ASSERT_TRUE(c) << k;
    EXPECT_EQ(c->status, 0) << k;
  }
  for (int k = 0; k < 2; k++) {
    EXPECT_EQ(std::memcmp(gs[k + 2]->Buf(0), gs[k]->Buf(0), 40000), 0) << k;
    EXPECT_EQ(std::memcmp(gs[k]->Buf(65536), gs[k + 2]->Buf(65536), 30000), 0) << k;
  }
  gs.clear();
  fs.clear();
  b.Stop();
  release.set_value();
  tb.join();
  unlink(ob.socket.c_str());
}

// Placement by peers (Worker::Place): a device moves to the worker of the
// devices its QPs connect to, with its traffic to a device it leaves
// behind in flight. Devices A, C on worker 0 and B, D on worker 1 (they
// alternate). A streams WRITEs to C; meanwhile A connects a QP to B (one
// peer on each worker: it stays) and one to D (two on worker 1: it moves,
// as worker 1 is not busier); B and D, connected after, stay. Every WRITE
// completes, in order, with its data; A serves B from worker 1, and C
// still reaches A across the workers.
TEST_F(DataPathOnTwoThreads, ADeviceMovesToItsPeersWorkerWithItsTrafficInFlight) {
  StartDaemon();
  std::vector<std::unique_ptr<Frontend>> fs;
  std::vector<std::unique_ptr<Guest>> gs;
  const unsigned first = AttachGuests(4, &fs, &gs);
  ASSERT_EQ(gs.size(), 4u);
  Guest &a = *gs[0], &b = *gs[1], &c = *gs[2], &d = *gs[3];
  ASSERT_EQ(WaitForWorker(first + 0), 0);
  ASSERT_EQ(WaitForWorker(first + 2), 0);
  GQp a_c = a.CreateQp(), a_b = a.CreateQp(), a_d = a.CreateQp();
  GQp c_a = c.CreateQp(), b_a = b.CreateQp(), d_a = d.CreateQp();
  a.Connect(a_c, c_a.qpn);
  c.Connect(c_a, a_c.qpn);
  EXPECT_EQ(d_->device_moves(), 0u);  // A and C share worker 0

  constexpr uint32_t kLen = 16384;
  Fill(a.Buf(0), kLen, 9);
  std::memset(c.Buf(0), 0, kMrLen);
  auto write = [&](uint64_t id) {
    vstellar_send_wqe w = Wqe(VSTELLAR_WR_RDMA_WRITE, id);
    w.u.rdma.remote_addr = kMrGpa + (id % 8) * kLen;
    w.u.rdma.rkey = c.rkey;
    a.PostSend(a_c, w, {a.Sge(0, kLen)});
  };
  uint64_t posted = 0;
  for (int i = 0; i < 16; i++) write(posted++);
  a.Connect(a_b, b_a.qpn);
  for (int i = 0; i < 16; i++) write(posted++);
  a.Connect(a_d, d_a.qpn);  // the move is decided at the end of this turn
  for (int i = 0; i < 16; i++) write(posted++);
  // B and D find their peer A on their own worker already.
  b.Connect(b_a, a_b.qpn);
  d.Connect(d_a, a_d.qpn);
  for (uint64_t i = 0; i < posted; i++) {
    auto cqe = a.Poll();
    ASSERT_TRUE(cqe) << "WRITE " << i << " never completed";
    EXPECT_EQ(cqe->wr_id, i) << "completions out of order";
    EXPECT_EQ(cqe->status, 0) << i;
  }
  for (uint32_t k = 0; k < 8; k++) EXPECT_EQ(std::memcmp(c.Buf(k * kLen), a.Buf(0), kLen), 0) << k;
  EXPECT_EQ(WaitForWorker(first + 0), 1) << "A moved to B and D's worker";
  EXPECT_EQ(d_->device_moves(), 1u);

  // A's other QPs work from worker 1: a WRITE to B, and C (still on
  // worker 0) READs from A across the workers.
  Fill(a.Buf(kLen), kLen, 33);
  vstellar_send_wqe w = Wqe(VSTELLAR_WR_RDMA_WRITE, 100);
  w.u.rdma.remote_addr = kMrGpa;
  w.u.rdma.rkey = b.rkey;
  a.PostSend(a_b, w, {a.Sge(kLen, kLen)});
  auto cqe = a.Poll();
  ASSERT_TRUE(cqe);
  EXPECT_EQ(cqe->wr_id, 100u);
  EXPECT_EQ(cqe->status, 0);
  EXPECT_EQ(std::memcmp(b.Buf(0), a.Buf(kLen), kLen), 0);
  w = Wqe(VSTELLAR_WR_RDMA_READ, 200);
  w.u.rdma.remote_addr = kMrGpa + kLen;
  w.u.rdma.rkey = a.rkey;
  c.PostSend(c_a, w, {c.Sge(2 * kLen, kLen)});
  cqe = c.Poll();
  ASSERT_TRUE(cqe);
  EXPECT_EQ(cqe->wr_id, 200u);
  EXPECT_EQ(cqe->status, 0);
  EXPECT_EQ(std::memcmp(c.Buf(2 * kLen), a.Buf(kLen), kLen), 0);
  // Destroying the moved QPs sends their numbers home; nothing leaks.
  for (auto& f : fs) f.reset();
}

}  // namespace vstellard::datapath_test
