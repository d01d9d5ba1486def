// Datagrams: the kernel's GSI QP (QP 1) and UD QPs, which device holds an
// address and so QP 1, and what user contexts may and may not have.
#include <gtest/gtest.h>

#include "vstellard/datapath_fixture.h"

namespace vstellard::datapath_test {

// rdma_cm's path: the kernel's GSI QP (QP 1) and kernel UD QPs, on the
// device that holds the daemon's address and on one that holds none, with
// kernel doorbell pages and SGEs with the local DMA lkey. QP 1 is found by
// destination GID; receives start with the GRH area.
void DataPath::KernelGsiAndUdQpsExchangeDatagrams() {
  StartDaemon();
  TwoDevices();
  Guest& A = *a_;
  Guest& B = *b_;
  A.SetupKernel(1);
  // B's kernel has no address: the daemon's one (127.0.0.1) is A's.
  B.SetupKernel(0);
  // The kernel page is given once; user contexts cannot ask for it.
  EXPECT_EQ(A.f.Command(VSTELLAR_CMD_KERNEL_DB, 0, nullptr, 0, 8).status(), VSTELLAR_STATUS_BUSY);

  uint16_t st = 0;
  GQp gsi = A.CreateQp(2, VSTELLAR_QPT_GSI, &st);
  ASSERT_EQ(st, 0);
  A.CreateQp(2, VSTELLAR_QPT_GSI, &st);
  EXPECT_EQ(st, VSTELLAR_STATUS_LIMIT);  // one QP 1 per device
  GQp ud = A.CreateQp(2, VSTELLAR_QPT_UD, &st);
  ASSERT_EQ(st, 0);
  GQp udb = B.CreateQp(2, VSTELLAR_QPT_UD, &st);
  ASSERT_EQ(st, 0);
  ASSERT_EQ(A.ToRtsUd(gsi.qpn, true, VSTELLAR_GSI_QKEY), 0);
  // A kernel QP may hold a controlled Q_Key (high bit set), as QP 1 does.
  ASSERT_EQ(A.ToRtsUd(ud.qpn, false, VSTELLAR_GSI_QKEY), 0);
  ASSERT_EQ(B.ToRtsUd(udb.qpn, false, VSTELLAR_GSI_QKEY), 0);

  // UD QP -> QP 1 of 127.0.0.1: a 256-byte "MAD" from guest-physical memory.
  constexpr uint64_t kMad = 0x8000;  // offset of the sent MAD in the MR
  Fill(A.Buf(kMad), 256, 3);
  std::memset(A.Buf(0), 0, 1024);
  A.PostRecv(gsi, 0x61, {vstellar_sge{kMrGpa, 512, VSTELLAR_LOCAL_DMA_LKEY}});
  A.PostSend(ud, UdWqe(0x51, 1, VSTELLAR_GSI_QPN, 0x1234), {vstellar_sge{kMrGpa + kMad, 256, VSTELLAR_LOCAL_DMA_LKEY}});
  auto sc = A.Poll();
  ASSERT_TRUE(sc);
  EXPECT_EQ(sc->status, 0);
  EXPECT_EQ(le64toh(sc->wr_id), 0x51u);
  // QP 1 wants Q_Key 0x80010000, so nothing arrives. Then with "the QP's
  // own Q_Key" (high bit set in the WQE), which is that one.
  EXPECT_FALSE(A.Poll(300));
  A.PostSend(ud, UdWqe(0x52, 1, VSTELLAR_GSI_QPN, 0x80000000u), {vstellar_sge{kMrGpa + kMad, 256, VSTELLAR_LOCAL_DMA_LKEY}});
  std::optional<vstellar_cqe> rc;
  for (int i = 0; i < 2; i++) {  // the send's and the receive's, in either order
    auto c = A.Poll();
    ASSERT_TRUE(c);
    if (c->opcode == VSTELLAR_WC_RECV) rc = c;
  }
  ASSERT_TRUE(rc);
  // Two workers: the MAD for QP 1 was steered to worker 1 (1 % 2) and
  // passed on to worker 0, whose device A holds the address.
  if (threads_ > 1) {
    EXPECT_GT(d_->forwarded(), 0u);
  }
  EXPECT_EQ(rc->status, 0);
  EXPECT_EQ(le64toh(rc->wr_id), 0x61u);
  EXPECT_EQ(le32toh(rc->qpn), gsi.qpn);
  EXPECT_EQ(le32toh(rc->src_qp), ud.qpn);
  EXPECT_EQ(le32toh(rc->byte_len), uint32_t(VSTELLAR_GRH_BYTES + 256));
  EXPECT_TRUE(rc->wc_flags & VSTELLAR_CQE_GRH);
  EXPECT_TRUE(rc->wc_flags & VSTELLAR_CQE_GRH_IPV4) << "IPv4 GIDs: the GRH area holds an IPv4 header";
  EXPECT_EQ(A.Buf(0)[20], 0x45);  // the IPv4 header of a RoCEv2 receive
  EXPECT_EQ(std::memcmp(A.Buf(VSTELLAR_GRH_BYTES), A.Buf(kMad), 256), 0);

  // QP 1 answers from QP 1, to another device's UD QP (receiving takes no
  // address).
  Fill(A.Buf(2048), 100, 9);
  Fetched(1, [&] { B.PostRecv(udb, 0x62, {vstellar_sge{kMrGpa + 4096, 512, VSTELLAR_LOCAL_DMA_LKEY}}); });
  A.PostSend(gsi, UdWqe(0x71, 1, udb.qpn, VSTELLAR_GSI_QKEY), {vstellar_sge{kMrGpa + 2048, 100, VSTELLAR_LOCAL_DMA_LKEY}});
  ASSERT_TRUE(A.Poll());
  rc = B.Poll();
  ASSERT_TRUE(rc);
  EXPECT_EQ(rc->status, 0);
  EXPECT_EQ(le32toh(rc->src_qp), uint32_t(VSTELLAR_GSI_QPN));
  EXPECT_EQ(std::memcmp(B.Buf(4096 + VSTELLAR_GRH_BYTES), A.Buf(2048), 100), 0);

  // Hostile WQEs fail their QP only: a source GID the device does not
  // have (B has none; A none at index 7), then (on a fresh QP) a datagram
  // larger than one packet.
  B.PostSend(udb, UdWqe(0x73, 1, VSTELLAR_GSI_QPN, VSTELLAR_GSI_QKEY), {vstellar_sge{kMrGpa, 16, VSTELLAR_LOCAL_DMA_LKEY}});
  auto bad = B.Poll();
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, uint8_t(vstellar::WcStatus::LOC_QP_OP_ERR));
  A.PostSend(gsi, UdWqe(0x72, 1, ud.qpn, VSTELLAR_GSI_QKEY, 7), {vstellar_sge{kMrGpa, 16, VSTELLAR_LOCAL_DMA_LKEY}});
  bad = A.Poll();
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, uint8_t(vstellar::WcStatus::LOC_QP_OP_ERR));
  EXPECT_EQ(A.QpState(ud.qpn), VSTELLAR_QPS_RTS);
  GQp ud2 = A.CreateQp(2, VSTELLAR_QPT_UD, &st);
  ASSERT_EQ(st, 0);
  ASSERT_EQ(A.ToRtsUd(ud2.qpn, false, 0x1234), 0);
  A.PostSend(ud2, UdWqe(0x53, 1, VSTELLAR_GSI_QPN, VSTELLAR_GSI_QKEY), {vstellar_sge{kMrGpa, 8192, VSTELLAR_LOCAL_DMA_LKEY}});
  bad = A.Poll();
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, uint8_t(vstellar::WcStatus::LOC_LEN_ERR));
}

TEST_F(DataPath, KernelGsiAndUdQpsExchangeDatagrams) { KernelGsiAndUdQpsExchangeDatagrams(); }
TEST_F(DataPathOnTwoThreads, KernelGsiAndUdQpsExchangeDatagrams) { KernelGsiAndUdQpsExchangeDatagrams(); }

// QP 1's traffic goes to the device that holds the address, never to
// another: the daemon serves only its own address, and one
// device at a time holds it. Writing it into a second device's GID table
// fails; once the holder lets go, the other device may take it.
void DataPath::OnlyOneDeviceHoldsAnAddressAndItsQp1() {
  StartDaemon();
  TwoDevices();
  Guest& A = *a_;
  Guest& B = *b_;
  A.SetupKernel(1);
  B.SetupKernel(0);
  auto gid = [](uint8_t last, uint32_t index) { return Guest::LoopbackGid(last, index); };
  auto add = [&](Guest& x, uint8_t last, uint32_t index) {
    auto g = gid(last, index);
    return x.Cmd(VSTELLAR_CMD_ADD_GID, &g, sizeof(g), 0).status();
  };
  auto del = [&](Guest& x, uint32_t index) {
    auto g = gid(0, index);
    return x.Cmd(VSTELLAR_CMD_DEL_GID, &g, sizeof(g), 0).status();
  };
  EXPECT_EQ(add(B, 1, 0), VSTELLAR_STATUS_BUSY) << "A holds 127.0.0.1";
  EXPECT_EQ(add(B, 9, 0), VSTELLAR_STATUS_ACCESS) << "the daemon does not serve 127.0.0.9";
  EXPECT_EQ(add(A, 9, 1), VSTELLAR_STATUS_ACCESS);
  EXPECT_EQ(add(A, 1, 1), VSTELLAR_STATUS_OK) << "the holder may list its address twice";
  // An IPv6 address (the netdev's link-local one) is listed, by any device,
  // so the guest's table matches its netdev; but nobody holds it: no
  // datagram leaves with it as its source.
  vstellar_cmd_gid v6{};
  v6.port = 1;
  v6.index = 2;
  v6.gid[0] = 0xfe;
  v6.gid[1] = 0x80;
  v6.gid[15] = 0x42;
  v6.gid_type = VSTELLAR_GID_TYPE_ROCE_V2;
  EXPECT_EQ(A.Cmd(VSTELLAR_CMD_ADD_GID, &v6, sizeof(v6), 0).status(), VSTELLAR_STATUS_OK);
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_ADD_GID, &v6, sizeof(v6), 0).status(), VSTELLAR_STATUS_OK);

  // B's QP 1 hears nothing sent to 127.0.0.1's QP 1; A's does.
  uint16_t st = 0;
  GQp gsia = A.CreateQp(2, VSTELLAR_QPT_GSI, &st);
  ASSERT_EQ(st, 0);
  GQp gsib = B.CreateQp(2, VSTELLAR_QPT_GSI, &st);
  ASSERT_EQ(st, 0);
  GQp ud = A.CreateQp(2, VSTELLAR_QPT_UD, &st);
  ASSERT_EQ(st, 0);
  ASSERT_EQ(A.ToRtsUd(gsia.qpn, true, VSTELLAR_GSI_QKEY), 0);
  ASSERT_EQ(B.ToRtsUd(gsib.qpn, true, VSTELLAR_GSI_QKEY), 0);
  ASSERT_EQ(A.ToRtsUd(ud.qpn, false, VSTELLAR_GSI_QKEY), 0);
  Fetched(1, [&] { B.PostRecv(gsib, 0x91, {vstellar_sge{kMrGpa, 512, VSTELLAR_LOCAL_DMA_LKEY}}); });
  A.PostRecv(gsia, 0x92, {vstellar_sge{kMrGpa, 512, VSTELLAR_LOCAL_DMA_LKEY}});
  A.PostSend(ud, UdWqe(0x93, 1, VSTELLAR_GSI_QPN, 0x80000000u), {vstellar_sge{kMrGpa + 4096, 64, VSTELLAR_LOCAL_DMA_LKEY}});
  bool got = false;
  for (int i = 0; i < 2; i++) {
    auto c = A.Poll();
    ASSERT_TRUE(c);
    got |= le64toh(c->wr_id) == 0x92u && c->status == 0;
  }
  EXPECT_TRUE(got);
  EXPECT_FALSE(B.Poll(300));
  A.PostSend(ud, UdWqe(0x94, 1, VSTELLAR_GSI_QPN, 0x80000000u, 2), {vstellar_sge{kMrGpa + 4096, 64, VSTELLAR_LOCAL_DMA_LKEY}});
  auto v6send = A.Poll();
  ASSERT_TRUE(v6send);
  EXPECT_EQ(v6send->status, uint8_t(vstellar::WcStatus::LOC_QP_OP_ERR)) << "sent from a GID it does not hold";

  // Released (both indexes), the address is B's to take, and then A's
  // second add fails.
  EXPECT_EQ(del(A, 0), VSTELLAR_STATUS_OK);
  EXPECT_EQ(add(B, 1, 0), VSTELLAR_STATUS_BUSY) << "A still lists it at index 1";
  EXPECT_EQ(del(A, 1), VSTELLAR_STATUS_OK);
  EXPECT_EQ(add(B, 1, 0), VSTELLAR_STATUS_OK);
  EXPECT_EQ(add(A, 1, 0), VSTELLAR_STATUS_BUSY);
  // A device that goes away gives its address back.
  b_.reset();
  fb_.reset();
  for (int i = 0; i < 100 && add(A, 1, 0) != VSTELLAR_STATUS_OK; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(add(A, 1, 0), VSTELLAR_STATUS_OK);
}

TEST_F(DataPath, OnlyOneDeviceHoldsAnAddressAndItsQp1) { OnlyOneDeviceHoldsAnAddressAndItsQp1(); }
TEST_F(DataPathOnTwoThreads, OnlyOneDeviceHoldsAnAddressAndItsQp1) { OnlyOneDeviceHoldsAnAddressAndItsQp1(); }

// User space gets UD QPs, but neither QP 1 nor the local DMA lkey.
TEST_F(DataPath, UserContextsGetUdButNotQp1NorTheDmaLkey) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  uint16_t st = 0;
  GQp ud = A.CreateQp(2, VSTELLAR_QPT_UD, &st);
  EXPECT_EQ(st, 0);
  // A UD QP of one process talks to another device's UD QP.
  GQp udb = b_->CreateQp(2, VSTELLAR_QPT_UD, &st);
  ASSERT_EQ(st, 0);
  ASSERT_EQ(A.ToRtsUd(ud.qpn, false, 0x4242), 0);
  ASSERT_EQ(b_->ToRtsUd(udb.qpn, false, 0x4242), 0);
  A.AddLoopbackGid(1);  // the kernel's GID cache
  b_->PostRecv(udb, 0x21, {b_->Sge(0, 512)});
  Fill(A.Buf(0), 100, 5);
  A.PostSend(ud, UdWqe(0x11, 1, udb.qpn, 0x4242), {A.Sge(0, 100)});
  ASSERT_TRUE(A.Poll());
  auto rc = b_->Poll();
  ASSERT_TRUE(rc);
  EXPECT_EQ(rc->status, 0);
  EXPECT_EQ(le32toh(rc->src_qp), ud.qpn);
  EXPECT_EQ(std::memcmp(b_->Buf(VSTELLAR_GRH_BYTES), A.Buf(0), 100), 0);
  A.CreateQp(2, VSTELLAR_QPT_GSI, &st);
  EXPECT_EQ(st, VSTELLAR_STATUS_UNSUPPORTED);
  EXPECT_EQ(A.f.Command(VSTELLAR_CMD_KERNEL_DB, A.uctx, nullptr, 0, 8).status(), VSTELLAR_STATUS_ACCESS);
  GQp qa = A.CreateQp(), qb = b_->CreateQp();
  A.Connect(qa, qb.qpn);
  b_->Connect(qb, qa.qpn);
  // An SGE naming the local DMA lkey with a guest-physical address.
  A.PostSend(qa, Wqe(VSTELLAR_WR_SEND, 0x1), {vstellar_sge{kCqGpa, 64, VSTELLAR_LOCAL_DMA_LKEY}});
  auto c = A.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, uint8_t(vstellar::WcStatus::LOC_PROT_ERR));
}

}  // namespace vstellard::datapath_test
