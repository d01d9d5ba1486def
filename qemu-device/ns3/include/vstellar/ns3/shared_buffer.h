// A switch's shared packet buffer: the ports of one switch draw from one
// pool, each admitted by the Dynamic Threshold rule (Choudhury and Hahne,
// 1998), as shallow-buffered data-centre switches (Broadcom Trident and
// Tomahawk, for one) share theirs: a packet joins a port's queue only if
// the queue stays within alpha times the pool's free space. One busy port
// may so take far more than an even share, yet always leaves room for
// others. ns-3 3.37 has no shared buffer of its own.
//
// SharedBufferQueueDisc is a port's root queue disc: it admits or drops by
// the rule and hands what it admits to one child queue disc (the FIFO or
// RED queue the port would otherwise have), which orders, marks and may
// still drop.
#pragma once

#include <cstdint>

#include <ns3/queue-disc.h>

namespace vstellar::ns3sim {

struct SharedBufferPool : ns3::SimpleRefCount<SharedBufferPool> {
  uint64_t capacity = 0;  // bytes, for every port of the switch
  double alpha = 1.0;     // Dynamic Threshold's factor
  uint64_t used = 0;
  uint64_t peak = 0;      // most ever used
};

class SharedBufferQueueDisc : public ns3::QueueDisc {
 public:
  static ns3::TypeId GetTypeId();
  SharedBufferQueueDisc();
  void SetPool(ns3::Ptr<SharedBufferPool> pool) { pool_ = pool; }

  static constexpr const char* kPoolDrop = "Shared buffer: over the port's dynamic threshold";

 private:
  bool DoEnqueue(ns3::Ptr<ns3::QueueDiscItem> item) override;
  ns3::Ptr<ns3::QueueDiscItem> DoDequeue() override;
  bool CheckConfig() override;
  void InitializeParams() override {}

  ns3::Ptr<SharedBufferPool> pool_;
};

}  // namespace vstellar::ns3sim
