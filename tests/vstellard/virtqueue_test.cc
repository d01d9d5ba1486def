// Virtqueue alone: a split ring laid out by the test in plain (memfd) guest
// memory, the device side popping, pushing and notifying.
#include <endian.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>

#include <cstring>
#include <string>

#include "vstellard/guest_ram.h"
#include "vstellard/pvdma.h"
#include "vstellard/virtqueue.h"

namespace vstellard {
namespace {

constexpr uint32_t kNum = 8;
constexpr uint64_t kDesc = 0x1000, kAvail = 0x2000, kUsed = 0x3000, kBuf = 0x10000;
constexpr uint16_t kNext = 1, kWrite = 2;

// The driver side of one ring, written straight into guest memory.
class VirtqueueRing : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ram_.ok());
    std::string err;
    ASSERT_TRUE(pvdma_.Attach(ram_.Table(), &err)) << err;
    vring_.num = kNum;
    vring_.desc = GuestRam::Va(kDesc);
    vring_.avail = GuestRam::Va(kAvail);
    vring_.used = GuestRam::Va(kUsed);
    vring_.addr_set = true;
    vring_.started = true;
    vring_.call = Fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  }
  void SetDesc(uint16_t i, uint64_t gpa, uint32_t len, uint16_t flags, uint16_t next = 0) {
    uint8_t* d = ram_.at(kDesc + 16ull * i);
    const uint64_t a = htole64(gpa);
    const uint32_t l = htole32(len);
    const uint16_t f = htole16(flags), n = htole16(next);
    std::memcpy(d, &a, 8);
    std::memcpy(d + 8, &l, 4);
    std::memcpy(d + 12, &f, 2);
    std::memcpy(d + 14, &n, 2);
  }
  // Makes chain `head` available and returns the new avail index.
  uint16_t Offer(uint16_t head) {
    const uint16_t h = htole16(head);
    std::memcpy(ram_.at(kAvail + 4 + 2ull * (avail_ % kNum)), &h, 2);
    avail_++;
    SetAvailIdx(avail_);
    return avail_;
  }
  void SetAvailIdx(uint16_t idx) {
    const uint16_t v = htole16(idx);
    std::memcpy(ram_.at(kAvail + 2), &v, 2);
  }
  uint16_t U16(uint64_t gpa) {
    uint16_t v;
    std::memcpy(&v, ram_.at(gpa), 2);
    return le16toh(v);
  }
  uint32_t U32(uint64_t gpa) {
    uint32_t v;
    std::memcpy(&v, ram_.at(gpa), 4);
    return le32toh(v);
  }
  // Calls signalled since the last look.
  uint64_t Calls() {
    uint64_t n = 0;
    if (read(vring_.call.get(), &n, sizeof(n)) != sizeof(n)) return 0;
    return n;
  }

  GuestRam ram_{4ull << 20};
  Pvdma pvdma_;
  Vring vring_;
  uint16_t avail_ = 0;
};

using Pop = Virtqueue::PopResult;

TEST_F(VirtqueueRing, PopCopiesTheChainPushPublishesItNotifySignals) {
  Virtqueue vq(pvdma_);
  SetDesc(0, kBuf, 16, kNext, 1);
  SetDesc(1, kBuf + 16, 8, kNext, 2);
  SetDesc(2, kBuf + 0x100, 64, kWrite);
  Offer(0);
  ASSERT_TRUE(vq.Begin(vring_, 0));
  Virtqueue::Chain c;
  ASSERT_EQ(vq.Pop(&c), Pop::kChain);
  EXPECT_EQ(c.head, 0);
  ASSERT_EQ(c.readable.size(), 2u);
  EXPECT_EQ(c.readable[1].gpa, kBuf + 16);
  EXPECT_EQ(c.readable_len, 24u);
  ASSERT_EQ(c.writable.size(), 1u);
  EXPECT_EQ(c.writable_len, 64u);
  EXPECT_EQ(vq.last_avail(), 1);
  EXPECT_EQ(vq.Pop(&c), Pop::kEmpty);

  // The readable bytes come out in order; the writable part takes a reply.
  std::memcpy(ram_.at(kBuf), "0123456789abcdefGHIJKLMN", 24);
  uint8_t req[24];
  ASSERT_TRUE(vq.ReadAll(c, req));
  EXPECT_EQ(std::memcmp(req, "0123456789abcdefGHIJKLMN", 24), 0);
  bool ok = false;
  EXPECT_EQ(vq.WriteAll(c, "reply", 5, &ok), 5u);
  EXPECT_TRUE(ok);
  EXPECT_EQ(std::memcmp(ram_.at(kBuf + 0x100), "reply", 5), 0);

  vq.Push(c.head, 5);
  EXPECT_EQ(U16(kUsed + 2), 1);      // used idx
  EXPECT_EQ(U32(kUsed + 4), 0u);     // used[0].id
  EXPECT_EQ(U32(kUsed + 8), 5u);     // used[0].len
  EXPECT_EQ(vq.used_idx(), 1);
  vq.Notify();
  EXPECT_EQ(Calls(), 1u);
  // A new batch with nothing pushed signals nothing.
  ASSERT_TRUE(vq.Begin(vring_, 0));
  vq.Notify();
  EXPECT_EQ(Calls(), 0u);
}

TEST_F(VirtqueueRing, TheDriverCanSuppressTheInterrupt) {
  Virtqueue vq(pvdma_);
  SetDesc(0, kBuf, 8, kWrite);
  const uint16_t no_interrupt = htole16(1);
  std::memcpy(ram_.at(kAvail), &no_interrupt, 2);
  Offer(0);
  ASSERT_TRUE(vq.Begin(vring_, 0));
  Virtqueue::Chain c;
  ASSERT_EQ(vq.Pop(&c), Pop::kChain);
  vq.Push(c.head, 0);
  vq.Notify();
  EXPECT_EQ(Calls(), 0u);
}

TEST_F(VirtqueueRing, ACorruptAvailableRingBreaksTheQueue) {
  Virtqueue vq(pvdma_);
  SetAvailIdx(kNum + 1);  // more entries than the ring holds
  ASSERT_TRUE(vq.Begin(vring_, 0));
  Virtqueue::Chain c;
  EXPECT_EQ(vq.Pop(&c), Pop::kBroken);
  vq.MarkBroken();
  EXPECT_FALSE(vq.Begin(vring_, 0));
  // A restart (new kick fd) gives the ring a new chance; the base stays.
  vq.Restart();
  EXPECT_TRUE(vq.Begin(vring_, 0));

  Virtqueue vq2(pvdma_);
  SetAvailIdx(0);
  avail_ = 0;
  Offer(kNum);  // a head beyond the ring
  ASSERT_TRUE(vq2.Begin(vring_, 0));
  EXPECT_EQ(vq2.Pop(&c), Pop::kBroken);
}

TEST_F(VirtqueueRing, BadChainsFailAlone) {
  Virtqueue vq(pvdma_);
  SetDesc(0, kBuf, 8, kNext, 1);  // 0 -> 1 -> 0: a loop
  SetDesc(1, kBuf, 8, kNext, 0);
  SetDesc(2, kBuf, 8, kWrite | kNext, 3);  // writable, then readable
  SetDesc(3, kBuf, 8, 0);
  SetDesc(4, kBuf, 8, 4 /* indirect */);  // indirect not negotiated
  SetDesc(5, kBuf, 8, kNext, kNum);       // next beyond the ring
  SetDesc(6, kBuf, 8, 0);                 // a good one
  for (uint16_t h : {0, 2, 4, 5, 6}) Offer(h);
  ASSERT_TRUE(vq.Begin(vring_, 0));
  Virtqueue::Chain c;
  for (uint16_t h : {0, 2, 4, 5}) {
    EXPECT_EQ(vq.Pop(&c), Pop::kBadChain) << "head " << h;
    EXPECT_EQ(c.head, h);
    vq.Push(c.head, 0);
  }
  EXPECT_EQ(vq.Pop(&c), Pop::kChain);
  EXPECT_EQ(c.head, 6);
}

TEST_F(VirtqueueRing, TheRingBaseSurvivesARestartAndTheUsedIndexIsReadAgain) {
  Virtqueue vq(pvdma_);
  vq.set_last_avail(5);  // SET_VRING_BASE
  avail_ = 5;
  SetDesc(3, kBuf, 8, kWrite);
  Offer(3);
  const uint16_t used = htole16(5);
  std::memcpy(ram_.at(kUsed + 2), &used, 2);
  ASSERT_TRUE(vq.Begin(vring_, 0));
  EXPECT_EQ(vq.used_idx(), 5);
  Virtqueue::Chain c;
  ASSERT_EQ(vq.Pop(&c), Pop::kChain);
  EXPECT_EQ(c.head, 3);
  vq.Push(c.head, 8);
  EXPECT_EQ(U32(kUsed + 4 + 8 * (5 % kNum)), 3u);
  vq.Restart();
  EXPECT_EQ(vq.last_avail(), 6);
  vq.Reset();
  EXPECT_EQ(vq.last_avail(), 0);
}

TEST_F(VirtqueueRing, WithEventIdxArmKickPublishesTheNextAvailIndex) {
  constexpr int kEventIdx = 29;
  Virtqueue vq(pvdma_);
  ASSERT_TRUE(vq.Begin(vring_, 0));
  EXPECT_FALSE(vq.ArmKick());  // without the feature nothing is written
  ASSERT_TRUE(vq.Begin(vring_, uint64_t{1} << kEventIdx));
  SetDesc(0, kBuf, 8, kWrite);
  Offer(0);
  Virtqueue::Chain c;
  ASSERT_EQ(vq.Pop(&c), Pop::kChain);
  EXPECT_TRUE(vq.ArmKick());
  EXPECT_EQ(U16(kUsed + 4 + 8 * kNum), 1);  // avail_event
  // used_event = 5: pushing used 0 -> 1 does not step over it, no call.
  const uint16_t ue = htole16(5);
  std::memcpy(ram_.at(kAvail + 4 + 2 * kNum), &ue, 2);
  vq.Push(c.head, 0);
  vq.Notify();
  EXPECT_EQ(Calls(), 0u);
}

}  // namespace
}  // namespace vstellard
