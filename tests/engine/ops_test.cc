// Every operation, byte-exact, over a clean simulated link.
#include "sim_pair.h"

namespace vstellar::test {
namespace {

struct OpsParam {
  uint32_t len;
  uint64_t block;  // translator split size
};

class Ops : public ::testing::TestWithParam<OpsParam> {};

TEST_P(Ops, WriteIsByteExact) {
  PairOptions o;
  o.block = GetParam().block;
  o.buf_size = 4 << 20;
  Pair t(o);
  uint32_t len = GetParam().len;
  fill_random(t.a.buf.data() + 3, len, len);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 7, 3, len, 5), 0);
  auto wc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(wc[0].opcode, WcOpcode::RDMA_WRITE);
  EXPECT_EQ(wc[0].wr_id, 7u);
  EXPECT_EQ(std::memcmp(t.a.buf.data() + 3, t.b.buf.data() + 5, len), 0);
  EXPECT_EQ(t.b.buf[4], 0);            // nothing before
  EXPECT_EQ(t.b.buf[5 + len], 0);      // nothing after
  Wc extra;
  EXPECT_EQ(t.b.eng->poll_cq(t.b.rcq, &extra, 1), 0);  // plain WRITE: no receive completion
}

TEST_P(Ops, SendIsByteExact) {
  PairOptions o;
  o.block = GetParam().block;
  o.buf_size = 4 << 20;
  Pair t(o);
  uint32_t len = GetParam().len;
  fill_random(t.a.buf.data(), len, len + 1);
  ASSERT_EQ(t.post_recv(t.b, 99, 8, len + 100), 0);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::SEND_WITH_IMM, 1, 0, len, 0, SEND_SIGNALED, 0x01020304), 0);
  auto rc = t.wait(t.b, t.b.rcq, 1);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(rc[0].opcode, WcOpcode::RECV);
  EXPECT_EQ(rc[0].wr_id, 99u);
  EXPECT_EQ(rc[0].byte_len, len);
  EXPECT_EQ(rc[0].imm_data, 0x01020304u);
  EXPECT_TRUE(rc[0].wc_flags & WC_WITH_IMM);
  EXPECT_EQ(rc[0].src_qp, t.a.qp->qpn());
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data() + 8, len), 0);
  auto sc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_EQ(sc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(sc[0].opcode, WcOpcode::SEND);
}

TEST_P(Ops, ReadIsByteExact) {
  PairOptions o;
  o.block = GetParam().block;
  o.buf_size = 4 << 20;
  Pair t(o);
  uint32_t len = GetParam().len;
  fill_random(t.b.buf.data() + 11, len, len + 2);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_READ, 5, 1, len, 11), 0);
  auto wc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(wc[0].opcode, WcOpcode::RDMA_READ);
  EXPECT_EQ(wc[0].byte_len, len);
  EXPECT_EQ(std::memcmp(t.b.buf.data() + 11, t.a.buf.data() + 1, len), 0);
  EXPECT_EQ(t.a.buf[0], 0);
  EXPECT_EQ(t.a.buf[1 + len], 0);
}

INSTANTIATE_TEST_SUITE_P(Sizes, Ops,
                         ::testing::Values(OpsParam{0, 0}, OpsParam{1, 0}, OpsParam{64, 0},
                                           OpsParam{4095, 0}, OpsParam{4096, 0},
                                           OpsParam{4097, 0}, OpsParam{65536, 0},
                                           OpsParam{1 << 20, 0}, OpsParam{3 << 20, 0},
                                           OpsParam{10000, 4096}, OpsParam{300000, 4096},
                                           OpsParam{70000, 512}));

TEST(Ops2, WriteWithImmConsumesReceive) {
  Pair t;
  fill_random(t.a.buf.data(), 10000, 3);
  ASSERT_EQ(t.post_recv(t.b, 55, 0, 0), 0);  // zero-length receive is fine for WRITE_IMM
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE_WITH_IMM, 1, 0, 10000, 500, SEND_SIGNALED, 77), 0);
  auto rc = t.wait(t.b, t.b.rcq, 1);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].opcode, WcOpcode::RECV_RDMA_WITH_IMM);
  EXPECT_EQ(rc[0].imm_data, 77u);
  EXPECT_EQ(rc[0].byte_len, 10000u);
  EXPECT_EQ(rc[0].wr_id, 55u);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data() + 500, 10000), 0);
}

TEST(Ops2, AtomicsReturnOriginalAndUpdate) {
  Pair t;
  uint64_t* target = reinterpret_cast<uint64_t*>(t.b.buf.data() + 64);
  *target = 100;
  Sge sg{t.a.addr(0), 8, t.a.mr->lkey()};
  SendWr wr;
  wr.wr_id = 1;
  wr.opcode = WrOpcode::ATOMIC_FETCH_AND_ADD;
  wr.send_flags = SEND_SIGNALED;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.remote_addr = t.b.addr(64);
  wr.rkey = t.b.mr->rkey();
  wr.compare_add = 5;
  ASSERT_EQ(t.a.eng->post_send(t.a.qp, wr), 0);
  auto wc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(wc[0].opcode, WcOpcode::FETCH_ADD);
  uint64_t got;
  std::memcpy(&got, t.a.buf.data(), 8);
  EXPECT_EQ(got, 100u);
  EXPECT_EQ(*target, 105u);
  // CAS that matches, then one that does not.
  wr.opcode = WrOpcode::ATOMIC_CMP_AND_SWP;
  wr.compare_add = 105;
  wr.swap = 7;
  wr.wr_id = 2;
  sg.addr = t.a.addr(8);
  ASSERT_EQ(t.a.eng->post_send(t.a.qp, wr), 0);
  wr.compare_add = 999;
  wr.swap = 8;
  wr.wr_id = 3;
  sg.addr = t.a.addr(16);
  ASSERT_EQ(t.a.eng->post_send(t.a.qp, wr), 0);
  wc = t.wait(t.a, t.a.scq, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 2u);
  EXPECT_EQ(wc[1].wr_id, 3u);
  std::memcpy(&got, t.a.buf.data() + 8, 8);
  EXPECT_EQ(got, 105u);
  std::memcpy(&got, t.a.buf.data() + 16, 8);
  EXPECT_EQ(got, 7u);  // the failed CAS returns the current value
  EXPECT_EQ(*target, 7u);
}

TEST(Ops2, InlineSendDoesNotReadSourceLater) {
  Pair t;
  uint8_t src[200];
  fill_random(src, sizeof(src), 9);
  ASSERT_EQ(t.post_recv(t.b, 1, 0, 4096), 0);
  Sge sg{uint64_t(uintptr_t(src)), sizeof(src), 0 /* lkey ignored for inline */};
  SendWr wr;
  wr.opcode = WrOpcode::SEND;
  wr.send_flags = SEND_SIGNALED | SEND_INLINE;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  ASSERT_EQ(t.a.eng->post_send(t.a.qp, wr), 0);
  uint8_t expect[200];
  std::memcpy(expect, src, 200);
  std::memset(src, 0xEE, sizeof(src));  // the WR was copied at post time
  auto rc = t.wait(t.b, t.b.rcq, 1);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].byte_len, 200u);
  EXPECT_EQ(std::memcmp(t.b.buf.data(), expect, 200), 0);
  // Too long for the QP's max_inline_data.
  std::vector<uint8_t> big(t.opt.cap.max_inline_data + 1);
  sg = {uint64_t(uintptr_t(big.data())), uint32_t(big.size()), 0};
  EXPECT_EQ(t.a.eng->post_send(t.a.qp, wr), EINVAL);
}

TEST(Ops2, MultiSgeGatherAndScatter) {
  Pair t;
  fill_random(t.a.buf.data(), 20000, 4);
  Sge sg[3] = {{t.a.addr(0), 1000, t.a.mr->lkey()},
               {t.a.addr(5000), 7000, t.a.mr->lkey()},
               {t.a.addr(15000), 3, t.a.mr->lkey()}};
  Sge rs[2] = {{t.b.addr(100), 4000, t.b.mr->lkey()}, {t.b.addr(50000), 10000, t.b.mr->lkey()}};
  RecvWr rwr;
  rwr.wr_id = 1;
  rwr.sg_list = rs;
  rwr.num_sge = 2;
  ASSERT_EQ(t.b.eng->post_recv(t.b.qp, rwr), 0);
  SendWr wr;
  wr.opcode = WrOpcode::SEND;
  wr.send_flags = SEND_SIGNALED;
  wr.sg_list = sg;
  wr.num_sge = 3;
  ASSERT_EQ(t.a.eng->post_send(t.a.qp, wr), 0);
  auto rc = t.wait(t.b, t.b.rcq, 1);
  ASSERT_EQ(rc.size(), 1u);
  ASSERT_EQ(rc[0].byte_len, 8003u);
  std::vector<uint8_t> msg, got;
  msg.insert(msg.end(), t.a.buf.begin(), t.a.buf.begin() + 1000);
  msg.insert(msg.end(), t.a.buf.begin() + 5000, t.a.buf.begin() + 12000);
  msg.insert(msg.end(), t.a.buf.begin() + 15000, t.a.buf.begin() + 15003);
  got.insert(got.end(), t.b.buf.begin() + 100, t.b.buf.begin() + 4100);
  got.insert(got.end(), t.b.buf.begin() + 50000, t.b.buf.begin() + 54003);
  EXPECT_EQ(msg, got);
}

TEST(Ops2, UnsignaledCompletesSilentlyAndInOrder) {
  Pair t;
  for (int i = 0; i < 10; i++) {
    ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, i, i * 100, 100, i * 100,
                          i % 3 == 0 ? uint32_t(SEND_SIGNALED) : 0u),
              0);
  }
  auto wc = t.wait(t.a, t.a.scq, 4);
  ASSERT_EQ(wc.size(), 4u);
  for (int k = 0; k < 4; k++) EXPECT_EQ(wc[k].wr_id, uint64_t(3 * k));
}

TEST(Ops2, ReadAfterWriteSeesTheWrite) {
  // Without a fence a READ still observes an earlier WRITE to the same
  // place: the responder runs READs only after every earlier PSN arrived.
  PairOptions o;
  o.cfg.num_paths = 16;
  Pair t(o);
  t.net.impairment.jitter_ns = 30'000;  // heavy reordering
  fill_random(t.a.buf.data(), 65536, 5);
  for (int i = 0; i < 20; i++) {
    ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 1, 0, 65536, 0, 0), 0);
    ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_READ, 2, 100000, 65536, 0), 0);
    auto wc = t.wait(t.a, t.a.scq, 1);
    ASSERT_EQ(wc.size(), 1u);
    ASSERT_EQ(wc[0].status, WcStatus::SUCCESS);
    ASSERT_EQ(std::memcmp(t.a.buf.data(), t.a.buf.data() + 100000, 65536), 0);
    t.a.buf[i] ^= 0xff;
    std::memset(t.a.buf.data() + 100000, 0, 65536);
  }
}

TEST(Ops2, FenceWaitsForEarlierRead) {
  Pair t;
  fill_random(t.b.buf.data(), 4096, 6);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_READ, 1, 0, 4096, 0), 0);
  // The fenced WRITE sends what the READ fetched into a.buf[0..4096).
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 2, 0, 4096, 8192, SEND_SIGNALED | SEND_FENCE), 0);
  auto wc = t.wait(t.a, t.a.scq, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[1].wr_id, 2u);
  EXPECT_EQ(std::memcmp(t.b.buf.data(), t.b.buf.data() + 8192, 4096), 0);
}

// A packet's last 8 bytes are stored after the rest (memory.cc): programs
// poll the end of what a peer writes (NCCL's clear-to-send entries). The
// translator sees the ranges in the order they are written.
TEST(Memory, LastEightBytesAreWrittenLast) {
  struct Recording : MemoryTranslator {
    std::vector<std::pair<uint64_t, uint64_t>> writes;
    uint8_t buf[512] = {};
    TranslateResult translate(uint64_t iova, uint64_t len, bool for_write, HostSpan* out, size_t) override {
      if (for_write) writes.emplace_back(iova, len);
      out[0] = {buf + iova, size_t(len)};
      TranslateResult r;
      r.ok = true;
      r.count = 1;
      r.covered = len;
      return r;
    }
  } t;
  uint8_t src[512];
  fill_random(src, sizeof(src), 4);
  ASSERT_TRUE(mem_write(t, 0, src, sizeof(src)));
  ASSERT_EQ(t.writes.size(), 2u);
  EXPECT_EQ(t.writes.back(), std::make_pair(uint64_t{504}, uint64_t{8}));
  EXPECT_EQ(std::memcmp(t.buf, src, sizeof(src)), 0);
}

}  // namespace
}  // namespace vstellar::test

namespace vstellar::test {

// IB C9-88: a zero-length RDMA WRITE or READ checks no R_Key (UCX's rc_verbs
// flushes with an empty WRITE whose rkey and address are 0).
TEST(Ops2, ZeroLengthWriteAndReadCheckNoRkey) {
  Pair p;
  for (WrOpcode op : {WrOpcode::RDMA_WRITE, WrOpcode::RDMA_READ}) {
    SendWr wr;
    wr.wr_id = 7;
    wr.opcode = op;
    wr.send_flags = SEND_SIGNALED;
    wr.remote_addr = 0;
    wr.rkey = 0;
    ASSERT_EQ(p.a.eng->post_send(p.a.qp, wr), 0);
    auto wc = p.wait(p.a, p.a.scq, 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, WcStatus::SUCCESS) << int(op);
  }
  // A non-empty WRITE with that rkey is still refused.
  ASSERT_EQ(p.post_send(p.a, WrOpcode::RDMA_WRITE, 8, 0, 16, 0), 0);
  SendWr wr;
  auto wc = p.wait(p.a, p.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS) << "the pair's own rkey";
  Sge sg{p.a.addr(0), 16, p.a.mr->lkey()};
  wr.opcode = WrOpcode::RDMA_WRITE;
  wr.send_flags = SEND_SIGNALED;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.rkey = 0;
  ASSERT_EQ(p.a.eng->post_send(p.a.qp, wr), 0);
  wc = p.wait(p.a, p.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::REM_ACCESS_ERR);
}

}  // namespace vstellar::test
