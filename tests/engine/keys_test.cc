// Memory keys: fast registration (states, key rotation, invalidation, local
// and remote), memory windows type 1 and 2, and the access errors that
// follow a stale, foreign or re-keyed key.
#include <set>

#include "sim_pair.h"

namespace vstellar::test {
namespace {

constexpr uint32_t kRw = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;

uint32_t next_key(uint32_t key) { return (key & ~0xFFu) | ((key + 1) & 0xFF); }

// Post a REG_MR on side s mapping [off, off + len) of its buffer under key.
int post_reg(Side& s, uint32_t key, uint64_t off, uint64_t len, uint32_t access, uint64_t wr_id = 100) {
  SendWr wr;
  wr.wr_id = wr_id;
  wr.opcode = WrOpcode::REG_MR;
  wr.send_flags = SEND_SIGNALED;
  wr.reg.key = key;
  wr.reg.iova = s.addr(off);
  wr.reg.length = len;
  wr.reg.access = access;
  wr.reg.mem = std::make_shared<HostMemory>();
  return s.eng->post_send(s.qp, wr);
}

int post_inv(Side& s, uint32_t key, uint64_t wr_id = 101, uint32_t flags = SEND_SIGNALED) {
  SendWr wr;
  wr.wr_id = wr_id;
  wr.opcode = WrOpcode::LOCAL_INV;
  wr.send_flags = flags;
  wr.invalidate_rkey = key;
  return s.eng->post_send(s.qp, wr);
}

int post_bind(Side& s, Mw* mw, uint32_t new_rkey, Mr* mr, uint64_t off, uint64_t len, uint32_t access,
              uint64_t wr_id = 102) {
  SendWr wr;
  wr.wr_id = wr_id;
  wr.opcode = WrOpcode::BIND_MW;
  wr.send_flags = SEND_SIGNALED;
  wr.bind.mw_rkey = mw->rkey();
  wr.bind.new_rkey = new_rkey;
  wr.bind.mr_lkey = mr->lkey();
  wr.bind.addr = s.addr(off);
  wr.bind.length = len;
  wr.bind.access = access;
  wr.bind.mw_type = mw->type();
  return s.eng->post_send(s.qp, wr);
}

// A signaled SEND of the one SGE sg.
SendWr send_of(Sge* sg, uint64_t wr_id) {
  SendWr wr;
  wr.wr_id = wr_id;
  wr.opcode = WrOpcode::SEND;
  wr.send_flags = SEND_SIGNALED;
  wr.sg_list = sg;
  wr.num_sge = 1;
  return wr;
}

// The same as a SEND_WITH_INV of key.
SendWr send_inv_of(Sge* sg, uint64_t wr_id, uint32_t key) {
  SendWr wr = send_of(sg, wr_id);
  wr.opcode = WrOpcode::SEND_WITH_INV;
  wr.invalidate_rkey = key;
  return wr;
}

// One completion of s's send CQ.
Wc one(Pair& t, Side& s) {
  auto wc = t.wait(s, s.scq, 1);
  EXPECT_EQ(wc.size(), 1u);
  return wc.empty() ? Wc{} : wc[0];
}

// After a LOCAL_INV of key k, the SEND wr (an SGE under k, 100 bytes to b)
// is still posted but completes with a local protection error.
void invalidate_then_send_fails(Pair& t, uint32_t k, const SendWr& wr) {
  ASSERT_EQ(post_inv(t.a, k), 0);
  EXPECT_EQ(one(t, t.a).status, WcStatus::SUCCESS);
  ASSERT_EQ(t.post_recv(t.b, 2, 0, 100), 0);
  ASSERT_EQ(t.a.eng->post_send(t.a.qp, wr), 0);
  EXPECT_EQ(one(t, t.a).status, WcStatus::LOC_PROT_ERR);
}

// a WRITEs len bytes into b at [addr, addr + len) under rkey; the status.
WcStatus write_to(Pair& t, uint64_t addr, uint32_t rkey, uint32_t len = 64) {
  Sge sg{t.a.addr(0), len, t.a.mr->lkey()};
  SendWr wr;
  wr.wr_id = 7;
  wr.opcode = WrOpcode::RDMA_WRITE;
  wr.send_flags = SEND_SIGNALED;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.remote_addr = addr;
  wr.rkey = rkey;
  EXPECT_EQ(t.a.eng->post_send(t.a.qp, wr), 0);
  return one(t, t.a).status;
}

WcStatus read_from(Pair& t, uint64_t addr, uint32_t rkey, uint32_t len = 64) {
  Sge sg{t.a.addr(4096), len, t.a.mr->lkey()};
  SendWr wr;
  wr.wr_id = 8;
  wr.opcode = WrOpcode::RDMA_READ;
  wr.send_flags = SEND_SIGNALED;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.remote_addr = addr;
  wr.rkey = rkey;
  EXPECT_EQ(t.a.eng->post_send(t.a.qp, wr), 0);
  return one(t, t.a).status;
}

TEST(Keys, FastRegMrStartsFreeAndRefusesAccess) {
  Pair t;
  Mr* fr = t.b.eng->alloc_mr(t.b.pd, 16);
  ASSERT_NE(fr, nullptr);
  EXPECT_EQ(fr->state(), MrState::FREE);
  EXPECT_TRUE(fr->fast_reg());
  EXPECT_EQ(fr->lkey(), fr->rkey());
  EXPECT_EQ(write_to(t, t.b.addr(0), fr->rkey()), WcStatus::REM_ACCESS_ERR);
}

TEST(Keys, RegisterInvalidateReregisterRotatesTheKey) {
  Pair t;
  Mr* fr = t.b.eng->alloc_mr(t.b.pd, 16);
  ASSERT_NE(fr, nullptr);
  const uint32_t k1 = next_key(fr->rkey());
  ASSERT_EQ(post_reg(t.b, k1, 8192, 4096, kRw), 0);
  Wc wc = one(t, t.b);
  EXPECT_EQ(wc.status, WcStatus::SUCCESS);
  EXPECT_EQ(wc.opcode, WcOpcode::REG_MR);
  EXPECT_EQ(fr->state(), MrState::VALID);
  EXPECT_EQ(fr->rkey(), k1);
  fill_random(t.a.buf.data(), 64, 1);
  EXPECT_EQ(write_to(t, t.b.addr(8192 + 100), k1), WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data() + 8192 + 100, 64), 0);

  ASSERT_EQ(post_inv(t.b, k1), 0);
  wc = one(t, t.b);
  EXPECT_EQ(wc.status, WcStatus::SUCCESS);
  EXPECT_EQ(wc.opcode, WcOpcode::LOCAL_INV);
  EXPECT_EQ(fr->state(), MrState::INVALID);

  // Registered again with the next key byte, over other pages.
  const uint32_t k2 = next_key(k1);
  ASSERT_EQ(post_reg(t.b, k2, 65536, 4096, kRw), 0);
  EXPECT_EQ(one(t, t.b).status, WcStatus::SUCCESS);
  fill_random(t.a.buf.data(), 64, 2);
  EXPECT_EQ(write_to(t, t.b.addr(65536), k2), WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data() + 65536, 64), 0);
  // The stale key of the first registration: an access error, not memory.
  std::vector<uint8_t> before(t.b.buf.begin() + 8192, t.b.buf.begin() + 8192 + 4096);
  EXPECT_EQ(write_to(t, t.b.addr(8192), k1), WcStatus::REM_ACCESS_ERR);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), t.b.buf.begin() + 8192));
  EXPECT_EQ(t.b.qp->state(), QpState::ERR);  // the responder's QP failed with it
}

TEST(Keys, InvalidatedKeyGetsRemoteAccessError) {
  Pair t;
  Mr* fr = t.b.eng->alloc_mr(t.b.pd, 4);
  const uint32_t k = next_key(fr->rkey());
  ASSERT_EQ(post_reg(t.b, k, 0, 4096, kRw), 0);
  ASSERT_EQ(post_inv(t.b, k), 0);
  auto wc = t.wait(t.b, t.b.scq, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[1].status, WcStatus::SUCCESS);
  EXPECT_EQ(read_from(t, t.b.addr(0), k), WcStatus::REM_ACCESS_ERR);
}

TEST(Keys, RegisteringAValidMrFails) {
  Pair t;
  Mr* fr = t.b.eng->alloc_mr(t.b.pd, 4);
  const uint32_t k = next_key(fr->rkey());
  ASSERT_EQ(post_reg(t.b, k, 0, 4096, kRw, 1), 0);
  ASSERT_EQ(post_reg(t.b, next_key(k), 4096, 4096, kRw, 2), 0);
  auto wc = t.wait(t.b, t.b.scq, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(wc[1].status, WcStatus::LOC_QP_OP_ERR);
  EXPECT_EQ(wc[1].vendor_err, VENDOR_BAD_STATE);
  EXPECT_EQ(fr->rkey(), k);  // unchanged
}

TEST(Keys, RegMrOfAnotherPdOrAPlainMrFails) {
  Pair t;
  Pd* other = t.b.eng->alloc_pd();
  Mr* fr = t.b.eng->alloc_mr(other, 4);
  ASSERT_EQ(post_reg(t.b, fr->rkey(), 0, 4096, kRw), 0);
  Wc wc = one(t, t.b);
  EXPECT_EQ(wc.status, WcStatus::LOC_PROT_ERR);
  EXPECT_EQ(wc.vendor_err, VENDOR_BAD_HANDLE);
  EXPECT_EQ(fr->state(), MrState::FREE);

  Pair u;
  ASSERT_EQ(post_reg(u.b, u.b.mr->lkey(), 0, 4096, kRw), 0);  // not a fast-registration MR
  EXPECT_EQ(one(u, u.b).status, WcStatus::LOC_PROT_ERR);
}

TEST(Keys, LocalInvalidateOfAForeignKeyFails) {
  Pair t;
  Pd* other = t.b.eng->alloc_pd();
  Mr* fr = t.b.eng->alloc_mr(other, 4);
  ASSERT_EQ(post_inv(t.b, fr->rkey()), 0);
  Wc wc = one(t, t.b);
  EXPECT_EQ(wc.status, WcStatus::LOC_PROT_ERR);
  EXPECT_EQ(wc.vendor_err, VENDOR_BAD_HANDLE);
  Pair u;
  ASSERT_EQ(post_inv(u.b, u.b.mr->lkey()), 0);  // ordinary MRs cannot be invalidated
  EXPECT_EQ(one(u, u.b).status, WcStatus::LOC_PROT_ERR);
  EXPECT_EQ(u.b.mr->state(), MrState::VALID);
}

TEST(Keys, FastRegMrServesAsLocalKeyOnlyWhileValid) {
  Pair t;
  Mr* fr = t.a.eng->alloc_mr(t.a.pd, 4);
  const uint32_t k = next_key(fr->rkey());
  ASSERT_EQ(post_reg(t.a, k, 0, 8192, kRw), 0);
  EXPECT_EQ(one(t, t.a).status, WcStatus::SUCCESS);
  fill_random(t.a.buf.data(), 100, 5);
  ASSERT_EQ(t.post_recv(t.b, 1, 0, 100), 0);
  Sge sg{t.a.addr(0), 100, k};
  SendWr wr = send_of(&sg, 3);
  ASSERT_EQ(t.a.eng->post_send(t.a.qp, wr), 0);
  EXPECT_EQ(one(t, t.a).status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data(), 100), 0);
  invalidate_then_send_fails(t, k, wr);
}

// A SEND whose SGE names the key a REG_MR queued just before it registers
// (iSER's command with immediate data): the key is checked when the SEND
// runs, not when it is posted, also where lkeys are checked at post.
TEST(Keys, SendMayUseTheKeyOfARegMrQueuedBeforeIt) {
  PairOptions o;
  o.cfg.lkeys_at_post = true;
  Pair t(o);
  Mr* fr = t.a.eng->alloc_mr(t.a.pd, 4);
  const uint32_t k = next_key(fr->rkey());
  fill_random(t.a.buf.data(), 100, 9);
  ASSERT_EQ(t.post_recv(t.b, 1, 0, 100), 0);
  ASSERT_EQ(post_reg(t.a, k, 0, 8192, kRw), 0);
  Sge sg{t.a.addr(0), 100, k};
  SendWr wr = send_of(&sg, 3);
  ASSERT_EQ(t.a.eng->post_send(t.a.qp, wr), 0);
  auto wc = t.wait(t.a, t.a.scq, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(wc[1].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data(), 100), 0);
  // Invalidated, the same SGE is posted and then fails when it runs.
  invalidate_then_send_fails(t, k, wr);
  // A plain MR's bad key still fails at post.
  Sge bad{t.a.addr(0), 100, t.a.mr->lkey() ^ 0x100};
  wr.sg_list = &bad;
  EXPECT_NE(t.a.eng->post_send(t.a.qp, wr), 0);
}

TEST(Keys, SendWithInvalidateInvalidatesTheResponderKey) {
  Pair t;
  Mr* fr = t.b.eng->alloc_mr(t.b.pd, 4);
  const uint32_t k = next_key(fr->rkey());
  ASSERT_EQ(post_reg(t.b, k, 0, 4096, kRw), 0);
  EXPECT_EQ(one(t, t.b).status, WcStatus::SUCCESS);
  ASSERT_EQ(t.post_recv(t.b, 9, 16384, 5000), 0);
  fill_random(t.a.buf.data(), 5000, 6);
  Sge sg{t.a.addr(0), 5000, t.a.mr->lkey()};
  SendWr wr = send_inv_of(&sg, 4, k);
  ASSERT_EQ(t.a.eng->post_send(t.a.qp, wr), 0);
  Wc sc = one(t, t.a);
  EXPECT_EQ(sc.status, WcStatus::SUCCESS);
  EXPECT_EQ(sc.opcode, WcOpcode::SEND);
  auto rc = t.wait(t.b, t.b.rcq, 1);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].status, WcStatus::SUCCESS);
  EXPECT_TRUE(rc[0].wc_flags & WC_WITH_INV);
  EXPECT_FALSE(rc[0].wc_flags & WC_WITH_IMM);
  EXPECT_EQ(rc[0].imm_data, k);
  EXPECT_EQ(rc[0].byte_len, 5000u);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data() + 16384, 5000), 0);
  EXPECT_EQ(fr->state(), MrState::INVALID);
  EXPECT_EQ(write_to(t, t.b.addr(0), k), WcStatus::REM_ACCESS_ERR);
}

// The key goes away in PSN order: a WRITE that uses it, sent before the
// SEND_WITH_INV and lost, still finds it valid when it is resent (as
// nvmet's data and then its answer, over a lossy link).
TEST(Keys, SendWithInvalidateWaitsForTheWritesBeforeIt) {
  Pair t;
  Mr* fr = t.b.eng->alloc_mr(t.b.pd, 4);
  const uint32_t k = next_key(fr->rkey());
  ASSERT_EQ(post_reg(t.b, k, 0, 8192, kRw), 0);
  EXPECT_EQ(one(t, t.b).status, WcStatus::SUCCESS);
  ASSERT_EQ(t.post_recv(t.b, 9, 16384, 100), 0);
  int writes = 0;
  t.drop_nth(kIpA, wire::Op::WRITE, 0, &writes);  // the WRITE's first try is lost
  fill_random(t.a.buf.data(), 4096, 7);
  Sge wsg{t.a.addr(0), 4096, t.a.mr->lkey()};
  SendWr w;
  w.wr_id = 1;
  w.opcode = WrOpcode::RDMA_WRITE;
  w.sg_list = &wsg;
  w.num_sge = 1;
  w.remote_addr = t.b.addr(0);
  w.rkey = k;
  ASSERT_EQ(t.a.eng->post_send(t.a.qp, w), 0);
  Sge sg{t.a.addr(8192), 100, t.a.mr->lkey()};
  SendWr inv = send_inv_of(&sg, 2, k);
  ASSERT_EQ(t.a.eng->post_send(t.a.qp, inv), 0);
  Wc sc = one(t, t.a);
  EXPECT_EQ(sc.status, WcStatus::SUCCESS) << to_string(sc.status);
  EXPECT_EQ(writes, 2);
  auto rc = t.wait(t.b, t.b.rcq, 1);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].status, WcStatus::SUCCESS);
  EXPECT_TRUE(rc[0].wc_flags & WC_WITH_INV);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data(), 4096), 0);
  EXPECT_EQ(fr->state(), MrState::INVALID);
}

TEST(Keys, SendWithInvalidateOfAKeyTheResponderMayNotTouchFails) {
  for (int variant = 0; variant < 3; variant++) {
    Pair t;
    uint32_t key;
    Mr* victim = nullptr;
    if (variant == 0) {  // a fast-registration MR of another PD
      victim = t.b.eng->alloc_mr(t.b.eng->alloc_pd(), 4);
      key = victim->rkey();
    } else if (variant == 1) {  // an ordinary MR
      key = t.b.mr->rkey();
    } else {  // a FREE MR (nothing to invalidate remotely)
      victim = t.b.eng->alloc_mr(t.b.pd, 4);
      key = victim->rkey();
    }
    ASSERT_EQ(t.post_recv(t.b, 9, 0, 100), 0);
    Sge sg{t.a.addr(0), 10, t.a.mr->lkey()};
    SendWr wr = send_inv_of(&sg, 4, key);
    ASSERT_EQ(t.a.eng->post_send(t.a.qp, wr), 0);
    EXPECT_EQ(one(t, t.a).status, WcStatus::REM_ACCESS_ERR) << variant;
    if (victim) {
      EXPECT_EQ(victim->state(), MrState::FREE) << variant;
    }
    EXPECT_EQ(t.b.mr->state(), MrState::VALID);
  }
}

TEST(Keys, KeysAreRandomAndRepeatOnlyWithASeed) {
  SimNet net(1);
  EngineConfig c1;
  c1.key_seed = 42;
  Engine e1(c1, net.add_node(1), net), e2(c1, net.add_node(2), net);
  EngineConfig c0;  // key_seed 0: getrandom
  Engine e3(c0, net.add_node(3), net);
  Pd* p1 = e1.alloc_pd();
  Pd* p2 = e2.alloc_pd();
  Pd* p3 = e3.alloc_pd();
  std::set<uint32_t> idx;
  uint32_t sequential = 0, prev = 0;
  for (int i = 0; i < 200; i++) {
    Mr* m1 = e1.alloc_mr(p1, 1);
    Mr* m2 = e2.alloc_mr(p2, 1);
    Mw* w3 = e3.alloc_mw(p3, 2);
    ASSERT_TRUE(m1 && m2 && w3);
    EXPECT_EQ(m1->lkey(), m2->lkey());  // one seed, one sequence
    EXPECT_NE(m1->lkey() >> 8, 0u);
    EXPECT_NE(w3->rkey() >> 8, 0u);
    idx.insert(w3->rkey() >> 8);
    if ((w3->rkey() >> 8) == prev + 1) sequential++;
    prev = w3->rkey() >> 8;
  }
  EXPECT_EQ(idx.size(), 200u);  // distinct while alive
  EXPECT_LT(sequential, 3u);    // not a counter
}

TEST(Keys, DeregisterWithBoundWindowIsBusy) {
  Pair t;
  Mr* mr = t.b.eng->reg_mr(t.b.pd, t.b.addr(0), 65536, kRw | ACCESS_MW_BIND, std::make_shared<HostMemory>());
  Mw* mw = t.b.eng->alloc_mw(t.b.pd, 1);
  ASSERT_TRUE(mr && mw);
  ASSERT_EQ(post_bind(t.b, mw, next_key(mw->rkey()), mr, 0, 4096, ACCESS_REMOTE_READ), 0);
  Wc wc = one(t, t.b);
  EXPECT_EQ(wc.status, WcStatus::SUCCESS);
  EXPECT_EQ(wc.opcode, WcOpcode::BIND_MW);
  EXPECT_EQ(t.b.eng->dereg_mr(mr), EBUSY);
  EXPECT_EQ(t.b.eng->dealloc_mw(mw), 0);
  EXPECT_EQ(t.b.eng->dereg_mr(mr), 0);
}

TEST(Keys, Type1WindowGrantsOnlyItsRangeAndRights) {
  Pair t;
  Mr* mr = t.b.eng->reg_mr(t.b.pd, t.b.addr(0), 65536, kRw | ACCESS_MW_BIND, std::make_shared<HostMemory>());
  Mw* mw = t.b.eng->alloc_mw(t.b.pd, 1);
  const uint32_t k = next_key(mw->rkey());
  ASSERT_EQ(post_bind(t.b, mw, k, mr, 4096, 4096, ACCESS_REMOTE_READ), 0);
  EXPECT_EQ(one(t, t.b).status, WcStatus::SUCCESS);
  EXPECT_EQ(mw->rkey(), k);
  fill_random(t.b.buf.data() + 4096, 4096, 9);
  EXPECT_EQ(read_from(t, t.b.addr(4096), k, 4096), WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data() + 4096, t.b.buf.data() + 4096, 4096), 0);
  // Unbind (length 0) with a new key byte: the window grants nothing.
  ASSERT_EQ(post_bind(t.b, mw, next_key(k), mr, 0, 0, 0), 0);
  EXPECT_EQ(one(t, t.b).status, WcStatus::SUCCESS);
  EXPECT_EQ(mw->mr(), nullptr);
  EXPECT_EQ(read_from(t, t.b.addr(4096), next_key(k)), WcStatus::REM_ACCESS_ERR);

  Pair u;  // beyond the window, and a right it does not grant
  Mr* mr2 = u.b.eng->reg_mr(u.b.pd, u.b.addr(0), 65536, kRw | ACCESS_MW_BIND, std::make_shared<HostMemory>());
  Mw* w2 = u.b.eng->alloc_mw(u.b.pd, 1);
  ASSERT_EQ(post_bind(u.b, w2, w2->rkey(), mr2, 4096, 4096, ACCESS_REMOTE_READ), 0);
  EXPECT_EQ(one(u, u.b).status, WcStatus::SUCCESS);
  EXPECT_EQ(write_to(u, u.b.addr(4096), w2->rkey()), WcStatus::REM_ACCESS_ERR);
  Pair v;
  Mr* mr3 = v.b.eng->reg_mr(v.b.pd, v.b.addr(0), 65536, kRw | ACCESS_MW_BIND, std::make_shared<HostMemory>());
  Mw* w3 = v.b.eng->alloc_mw(v.b.pd, 1);
  ASSERT_EQ(post_bind(v.b, w3, w3->rkey(), mr3, 4096, 4096, ACCESS_REMOTE_READ), 0);
  EXPECT_EQ(one(v, v.b).status, WcStatus::SUCCESS);
  EXPECT_EQ(read_from(v, v.b.addr(4096 + 4000), w3->rkey(), 200), WcStatus::REM_ACCESS_ERR);
}

TEST(Keys, BindChecksTheMr) {
  struct Case {
    const char* what;
    uint32_t mr_access;
    bool other_pd;
    uint64_t off, len;
    uint32_t access;
    uint32_t vendor;
  };
  const Case cases[] = {
      {"MR without MW_BIND", kRw, false, 0, 4096, ACCESS_REMOTE_READ, VENDOR_ACCESS},
      {"MR of another PD", kRw | ACCESS_MW_BIND, true, 0, 4096, ACCESS_REMOTE_READ, VENDOR_BAD_HANDLE},
      {"window beyond the MR", kRw | ACCESS_MW_BIND, false, 60000, 8192, ACCESS_REMOTE_READ, VENDOR_ACCESS},
      {"remote write without local write", ACCESS_REMOTE_READ | ACCESS_MW_BIND, false, 0, 4096,
       ACCESS_REMOTE_WRITE, VENDOR_ACCESS},
      {"local write is no window right", kRw | ACCESS_MW_BIND, false, 0, 4096, ACCESS_LOCAL_WRITE,
       VENDOR_BAD_FIELD},
  };
  for (const Case& c : cases) {
    Pair t;
    Pd* pd = c.other_pd ? t.b.eng->alloc_pd() : t.b.pd;
    Mr* mr = t.b.eng->reg_mr(pd, t.b.addr(0), 65536, c.mr_access, std::make_shared<HostMemory>());
    Mw* mw = t.b.eng->alloc_mw(t.b.pd, 1);
    ASSERT_TRUE(mr && mw) << c.what;
    ASSERT_EQ(post_bind(t.b, mw, mw->rkey(), mr, c.off, c.len, c.access), 0);
    Wc wc = one(t, t.b);
    EXPECT_EQ(wc.status, WcStatus::MW_BIND_ERR) << c.what;
    EXPECT_EQ(wc.vendor_err, c.vendor) << c.what;
    EXPECT_EQ(mw->mr(), nullptr) << c.what;
    EXPECT_EQ(mr->bound_windows(), 0u) << c.what;
  }
}

TEST(Keys, Type2WindowBelongsToItsQpUntilInvalidated) {
  Pair t;
  Mr* mr = t.b.eng->reg_mr(t.b.pd, t.b.addr(0), 65536, kRw | ACCESS_MW_BIND, std::make_shared<HostMemory>());
  Mw* mw = t.b.eng->alloc_mw(t.b.pd, 2);
  EXPECT_EQ(mw->state(), MrState::FREE);
  const uint32_t k = next_key(mw->rkey());
  ASSERT_EQ(post_bind(t.b, mw, k, mr, 0, 8192, ACCESS_REMOTE_READ | ACCESS_REMOTE_WRITE), 0);
  EXPECT_EQ(one(t, t.b).status, WcStatus::SUCCESS);
  EXPECT_EQ(mw->state(), MrState::VALID);
  EXPECT_EQ(mw->qpn(), t.b.qp->qpn());
  fill_random(t.a.buf.data(), 64, 11);
  EXPECT_EQ(write_to(t, t.b.addr(100), k), WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data() + 100, 64), 0);
  // A bound type 2 window cannot be bound again before it is invalidated.
  ASSERT_EQ(post_bind(t.b, mw, next_key(k), mr, 0, 4096, ACCESS_REMOTE_READ), 0);
  Wc wc = one(t, t.b);
  EXPECT_EQ(wc.status, WcStatus::MW_BIND_ERR);
  EXPECT_EQ(wc.vendor_err, VENDOR_BAD_STATE);
  EXPECT_EQ(mw->rkey(), k);

  Pair u;
  Mr* mr2 = u.b.eng->reg_mr(u.b.pd, u.b.addr(0), 65536, kRw | ACCESS_MW_BIND, std::make_shared<HostMemory>());
  Mw* w2 = u.b.eng->alloc_mw(u.b.pd, 2);
  const uint32_t k2 = next_key(w2->rkey());
  ASSERT_EQ(post_bind(u.b, w2, k2, mr2, 0, 8192, ACCESS_REMOTE_READ), 0);
  ASSERT_EQ(post_inv(u.b, k2), 0);
  auto wcs = u.wait(u.b, u.b.scq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[1].status, WcStatus::SUCCESS);
  EXPECT_EQ(wcs[1].opcode, WcOpcode::LOCAL_INV);
  EXPECT_EQ(w2->state(), MrState::INVALID);
  EXPECT_EQ(mr2->bound_windows(), 0u);
  EXPECT_EQ(read_from(u, u.b.addr(0), k2), WcStatus::REM_ACCESS_ERR);
}

// A second connected QP pair between the same two engines.
std::pair<Qp*, Qp*> second_pair(Pair& t) {
  Qp* qa = t.a.qp;
  Qp* qb = t.b.qp;
  QpInitAttr ia;
  ia.send_cq = t.a.scq;
  ia.recv_cq = t.a.rcq;
  t.a.qp = t.a.eng->create_qp(t.a.pd, ia);
  ia.send_cq = t.b.scq;
  ia.recv_cq = t.b.rcq;
  t.b.qp = t.b.eng->create_qp(t.b.pd, ia);
  t.connect();
  std::pair<Qp*, Qp*> r{t.a.qp, t.b.qp};
  t.a.qp = qa;
  t.b.qp = qb;
  return r;
}

TEST(Keys, Type2WindowIsUsableOnlyThroughItsQp) {
  Pair t;
  auto [qa2, qb2] = second_pair(t);
  ASSERT_TRUE(qa2 && qb2);
  Mr* mr = t.b.eng->reg_mr(t.b.pd, t.b.addr(0), 65536, kRw | ACCESS_MW_BIND, std::make_shared<HostMemory>());
  Mw* mw = t.b.eng->alloc_mw(t.b.pd, 2);
  const uint32_t k = next_key(mw->rkey());
  ASSERT_EQ(post_bind(t.b, mw, k, mr, 0, 4096, ACCESS_REMOTE_READ), 0);
  EXPECT_EQ(one(t, t.b).status, WcStatus::SUCCESS);
  EXPECT_EQ(mw->qpn(), t.b.qp->qpn());
  EXPECT_EQ(read_from(t, t.b.addr(0), k), WcStatus::SUCCESS);
  // The same PD, the same key, through the other connection: refused.
  Qp* qa = t.a.qp;
  t.a.qp = qa2;
  EXPECT_EQ(read_from(t, t.b.addr(0), k), WcStatus::REM_ACCESS_ERR);
  t.a.qp = qa;
  EXPECT_EQ(qb2->state(), QpState::ERR);
  EXPECT_EQ(t.b.qp->state(), QpState::RTS);
}

TEST(Keys, DestroyingTheQpInvalidatesItsType2Windows) {
  Pair t;
  auto [qa2, qb2] = second_pair(t);
  Mr* mr = t.b.eng->reg_mr(t.b.pd, t.b.addr(0), 65536, kRw | ACCESS_MW_BIND, std::make_shared<HostMemory>());
  Mw* mw = t.b.eng->alloc_mw(t.b.pd, 2);
  Qp* qb = t.b.qp;
  t.b.qp = qb2;
  ASSERT_EQ(post_bind(t.b, mw, mw->rkey(), mr, 0, 4096, ACCESS_REMOTE_READ), 0);
  EXPECT_EQ(one(t, t.b).status, WcStatus::SUCCESS);
  t.b.qp = qb;
  EXPECT_EQ(mr->bound_windows(), 1u);
  EXPECT_EQ(t.b.eng->destroy_qp(qb2), 0);
  EXPECT_EQ(mw->state(), MrState::INVALID);
  EXPECT_EQ(mr->bound_windows(), 0u);
  EXPECT_EQ(t.b.eng->dereg_mr(mr), 0);
}

// LOCAL_INV waits for the WQEs before it: a SEND gathered from the MR that
// loses a packet must be able to resend it from the MR after the
// invalidation was posted.
TEST(Keys, LocalInvalidateWaitsForEarlierWqesToComplete) {
  Pair t;
  Mr* fr = t.a.eng->alloc_mr(t.a.pd, 32);
  const uint32_t k = next_key(fr->rkey());
  ASSERT_EQ(post_reg(t.a, k, 0, 65536, kRw), 0);
  EXPECT_EQ(one(t, t.a).status, WcStatus::SUCCESS);
  bool dropped = false;
  t.net.tap = [&](uint32_t from, uint32_t, uint16_t, std::vector<uint8_t>& bytes) {
    wire::Packet p;
    if (dropped || from != kIpA || wire::parse(bytes.data(), bytes.size(), p) != wire::ParseError::OK) return true;
    if (p.base.op == wire::Op::SEND && (p.base.flags & wire::F_LAST)) {
      dropped = true;  // the last packet's first transmission
      return false;
    }
    return true;
  };
  fill_random(t.a.buf.data(), 40000, 12);
  ASSERT_EQ(t.post_recv(t.b, 1, 0, 40000), 0);
  Sge sg{t.a.addr(0), 40000, k};
  SendWr wr;
  wr.wr_id = 3;
  wr.opcode = WrOpcode::SEND;
  wr.send_flags = SEND_SIGNALED;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  ASSERT_EQ(t.a.eng->post_send(t.a.qp, wr), 0);
  ASSERT_EQ(post_inv(t.a, k, 4), 0);
  auto wc = t.wait(t.a, t.a.scq, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_TRUE(dropped);
  EXPECT_EQ(wc[0].wr_id, 3u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(wc[1].wr_id, 4u);
  EXPECT_EQ(wc[1].status, WcStatus::SUCCESS);
  EXPECT_EQ(fr->state(), MrState::INVALID);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data(), 40000), 0);
}

}  // namespace
}  // namespace vstellar::test
