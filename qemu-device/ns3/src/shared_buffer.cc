// A switch's shared buffer with Dynamic Threshold admission (see the header).
#include "vstellar/ns3/shared_buffer.h"

#include <ns3/log.h>
#include <ns3/queue-disc.h>

namespace vstellar::ns3sim {

using namespace ns3;

NS_OBJECT_ENSURE_REGISTERED(SharedBufferQueueDisc);

TypeId SharedBufferQueueDisc::GetTypeId() {
  static TypeId tid = TypeId("vstellar::ns3sim::SharedBufferQueueDisc")
                          .SetParent<QueueDisc>()
                          .SetGroupName("TrafficControl")
                          .AddConstructor<SharedBufferQueueDisc>();
  return tid;
}

// The child queue disc holds the packets and enforces the port's own
// ceiling; this one has no limit of its own.
SharedBufferQueueDisc::SharedBufferQueueDisc() : QueueDisc(QueueDiscSizePolicy::NO_LIMITS) {}

bool SharedBufferQueueDisc::DoEnqueue(Ptr<QueueDiscItem> item) {
  const uint64_t size = item->GetSize();
  const uint64_t free = pool_->capacity - pool_->used;
  // Dynamic Threshold: this port's queue, with the packet, within alpha
  // times what the pool has free now; and the pool itself not overrun.
  if (size > free || double(GetNBytes() + size) > pool_->alpha * double(free)) {
    DropBeforeEnqueue(item, kPoolDrop);
    return false;
  }
  // A drop by the child (its ceiling, RED) reaches our Drop trace through
  // QueueDisc's child drop functor; it takes nothing from the pool.
  if (!GetQueueDiscClass(0)->GetQueueDisc()->Enqueue(item)) return false;
  pool_->used += size;
  if (pool_->used > pool_->peak) pool_->peak = pool_->used;
  return true;
}

Ptr<QueueDiscItem> SharedBufferQueueDisc::DoDequeue() {
  Ptr<QueueDiscItem> item = GetQueueDiscClass(0)->GetQueueDisc()->Dequeue();
  if (item) pool_->used -= item->GetSize();
  return item;
}

bool SharedBufferQueueDisc::CheckConfig() {
  if (GetNQueueDiscClasses() != 1) return false;  // one child queue
  if (GetNPacketFilters() != 0) return false;
  return pool_ != nullptr;
}

}  // namespace vstellar::ns3sim
