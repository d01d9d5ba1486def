// vstellard's vhost-user server: message layouts (vhost-user protocol, see
// QEMU's docs/interop/vhost-user.rst) and one session = one QEMU
// connection = one virtual vStellar device.
//
// Written by hand rather than on libvhost-user: libvhost-user mmaps every
// guest memory region eagerly when SET_MEM_TABLE arrives, which is exactly
// what PVDMA must not do (Stellar maps and pins guest memory on first DMA,
// 2 MiB at a time). Here SET_MEM_TABLE only records the regions and keeps
// their fds; PVDMA maps lazily from them.
//
// Every field of every message is validated; a malformed message ends the
// session (the frontend sees the socket close and reports the device lost
// to the guest), never the daemon.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <vstellar/virtio_vstellar.h>

#include "vstellard/device_state.h"
#include "vstellard/dirty_log.h"
#include "vstellard/memory_region.h"

namespace vstellard {

enum class Request : uint32_t {
  kGetFeatures = 1,
  kSetFeatures = 2,
  kSetOwner = 3,
  kResetOwner = 4,
  kSetMemTable = 5,
  kSetLogBase = 6,
  kSetLogFd = 7,
  kSetVringNum = 8,
  kSetVringAddr = 9,
  kSetVringBase = 10,
  kGetVringBase = 11,
  kSetVringKick = 12,
  kSetVringCall = 13,
  kSetVringErr = 14,
  kGetProtocolFeatures = 15,
  kSetProtocolFeatures = 16,
  kGetQueueNum = 17,
  kSetVringEnable = 18,
  kGetConfig = 24,
  kSetConfig = 25,
  kResetDevice = 34,
  kSetDeviceStateFd = 42,  // QEMU 8.2's; vStellar's QEMU 7.2 has it backported
  kCheckDeviceState = 43,
};

constexpr uint32_t kFlagVersionMask = 0x3;
constexpr uint32_t kFlagVersion = 0x1;
constexpr uint32_t kFlagReply = 1u << 2;
constexpr uint32_t kFlagNeedReply = 1u << 3;

// Virtio/vhost feature bits this server knows.
constexpr int kFeatureLogAll = 26;  // VHOST_F_LOG_ALL: dirty logging (migration)
constexpr int kFeatureIndirectDesc = 28;
constexpr int kFeatureEventIdx = 29;
constexpr int kFeatureProtocolFeatures = 30;  // VHOST_USER_F_PROTOCOL_FEATURES
constexpr int kFeatureVersion1 = 32;
constexpr int kFeatureRingReset = 40;
// Protocol feature bits.
constexpr int kProtocolMq = 0;
constexpr int kProtocolLogShmfd = 1;
constexpr int kProtocolReplyAck = 3;
constexpr int kProtocolConfig = 9;
// With both of these, only RESET_DEVICE resets the device; GET_VRING_BASE
// of the control queue is a stop (a VM paused or migrating keeps its
// objects): Session::stop_is_not_reset.
constexpr int kProtocolResetDevice = 13;
constexpr int kProtocolDeviceState = 19;

constexpr uint32_t kVringFlagLog = 1;  // VHOST_VRING_F_LOG
constexpr uint32_t kStateSave = 0, kStateLoad = 1;  // SET_DEVICE_STATE_FD directions

constexpr uint64_t kVringIndexMask = 0xff;
constexpr uint64_t kVringNoFd = 1u << 8;
constexpr uint32_t kMaxMemRegions = 8;     // VHOST_MEMORY_BASELINE_NREGIONS
constexpr uint32_t kMaxVringSize = 32768;  // split ring
constexpr uint32_t kMaxConfigSize = 256;
constexpr uint32_t kMaxPayload = 8 + kMaxMemRegions * 32 + 16;

#pragma pack(push, 1)
struct Header {
  uint32_t request;
  uint32_t flags;
  uint32_t size;
};
struct VringState {
  uint32_t index;
  uint32_t num;
};
struct VringAddr {
  uint32_t index;
  uint32_t flags;
  uint64_t desc_user_addr;
  uint64_t used_user_addr;
  uint64_t avail_user_addr;
  uint64_t log_guest_addr;
};
struct MemRegionDesc {
  uint64_t guest_phys_addr;
  uint64_t memory_size;
  uint64_t userspace_addr;
  uint64_t mmap_offset;
};
struct LogBase {  // SET_LOG_BASE
  uint64_t mmap_size;
  uint64_t mmap_offset;
};
struct DeviceStateFd {  // SET_DEVICE_STATE_FD
  uint32_t direction;  // kStateSave, kStateLoad
  uint32_t phase;      // 0: the device is stopped
};
struct ConfigHeader {
  uint32_t offset;
  uint32_t size;
  uint32_t flags;
};
#pragma pack(pop)
static_assert(sizeof(Header) == 12);
static_assert(sizeof(VringAddr) == 40);
static_assert(sizeof(MemRegionDesc) == 32);

struct Message {
  Header hdr{};
  std::vector<uint8_t> payload;
  std::vector<Fd> fds;
};

struct Vring {
  uint32_t num = 0;
  uint64_t desc = 0, avail = 0, used = 0;  // QEMU addresses
  bool addr_set = false;
  // The ring base of SET_VRING_BASE / GET_VRING_BASE (the next available
  // entry). While the ring runs, the device's Virtqueue owns that index;
  // the device hands it over around these two messages.
  uint16_t base = 0;
  bool enabled = false;
  bool started = false;  // got a kick fd
  Fd kick, call, err;
  // From its kick or SET_VRING_ENABLE until GET_VRING_BASE stops it: its
  // layout (SET_VRING_NUM, _ADDR, _BASE) is fixed meanwhile, as the
  // vhost-user spec has the frontend change it only on a stopped ring.
  bool running() const { return started || enabled; }
};

// What the device does with SET_DEVICE_STATE_FD and CHECK_DEVICE_STATE
// (Device implements it): Begin takes the fd to write the state into
// (save) or read it from (load); Check says whether it all went well (for a
// load: whether the device took the state).
class DeviceStateTransfer {
 public:
  virtual ~DeviceStateTransfer() = default;
  virtual bool BeginStateTransfer(bool save, Fd fd) = 0;
  virtual bool CheckStateTransfer() = 0;
};

struct Outcome {
  std::optional<std::vector<uint8_t>> reply;  // whole reply message
  std::string error;                          // non-empty: end the session
  bool ok() const { return error.empty(); }
};

// The vhost-user side of one device. It reads and writes the device's
// state (features, config space) that the Device owns and lends it.
class Session : public DeviceTransport {
 public:
  // `log`: the device's dirty log, which SET_LOG_BASE maps and
  // SET_FEATURES (VHOST_F_LOG_ALL) turns on.
  Session(DeviceState& state, std::shared_ptr<DirtyLog> log = std::make_shared<DirtyLog>());
  // Offers DEVICE_STATE and passes its requests to `t` (the device).
  void set_state_transfer(DeviceStateTransfer* t) { state_transfer_ = t; }
  // Whether GET_VRING_BASE of the control queue only stops the device:
  // the frontend resets it with RESET_DEVICE and migrates its state
  // (vStellar's QEMU acks both). QEMU 7.2 as Debian ships it acks
  // RESET_DEVICE whenever a backend offers it but never sends it for this
  // device, so RESET_DEVICE alone does not say that the frontend will.
  bool stop_is_not_reset() const {
    const uint64_t both = (uint64_t{1} << kProtocolResetDevice) | (uint64_t{1} << kProtocolDeviceState);
    return (acked_protocol_ & both) == both;
  }

  // Handles one message: validates it, applies it, returns the reply (if
  // the request has one) or an error after which the caller closes the
  // connection (a failure ack is in reply when one was asked for).
  Outcome Handle(Message&& m);

  uint64_t offered_features() const;
  uint64_t offered_protocol_features() const;
  uint64_t acked_features() const { return state_.acked_features(); }
  uint64_t acked_protocol_features() const { return acked_protocol_; }
  bool owned() const { return owner_; }
  const std::vector<MemRegion>& regions() const { return regions_; }
  const Vring& vring(uint32_t i) const { return vrings_.at(i); }
  Vring& mutable_vring(uint32_t i) { return vrings_.at(i); }
  size_t num_vrings() const { return vrings_.size(); }

  // Finds the region holding [qemu_va, qemu_va + len).
  const MemRegion* FindByQemuVa(uint64_t qemu_va, uint64_t len) const;

  // This device's doorbell region: the one the frontend named with
  // config.db_region_id, or, from a frontend that names none, the only
  // doorbell region of the table. nullptr if there is none (or, unnamed,
  // more than one: another device's doorbells must never be taken).
  const MemRegion* DoorbellRegion() const override;
  uint32_t QueueSize(uint32_t queue) const override {
    return queue < vrings_.size() ? vrings_[queue].num : 0;
  }

 private:
  Outcome HandleOne(Message& m);
  Outcome HandleFeatures(const Message& m);
  Outcome HandleOwner(const Message& m);
  Outcome HandleVringState(const Message& m);
  bool HasOwner(const Header& h, std::string* err) const;
  static bool NoFds(const Message& m, std::string* err);
  static bool Empty(const Message& m, const char* name, std::string* err);
  Outcome SetMemTable(Message& m);
  Outcome SetVringAddr(const VringAddr& a);
  Outcome SetVringFd(Message& m, Fd Vring::*which);
  Outcome SetLogBase(Message& m);
  Outcome DeviceStateRequest(Message& m);
  Outcome GetConfig(const Message& m);
  Outcome SetConfig(const Message& m);
  bool CheckVringIndex(uint32_t index, std::string* err) const;

  DeviceState& state_;
  std::shared_ptr<DirtyLog> log_;
  DeviceStateTransfer* state_transfer_ = nullptr;
  bool owner_ = false;
  bool features_set_ = false;
  uint64_t acked_protocol_ = 0;
  std::vector<MemRegion> regions_;
  std::vector<Vring> vrings_;
};

// Transport: reads one message (header, payload, SCM_RIGHTS fds) from a
// connected unix socket. Returns false with *err empty at clean EOF.
bool ReadMessage(int sock, Message* m, std::string* err);
bool WriteAll(int sock, const std::vector<uint8_t>& bytes, std::string* err);

// The daemon's side of the transport: reads messages from a non-blocking
// socket without ever waiting. A message that arrives in parts is kept
// (header bytes, payload bytes, fds) until it is complete, so a frontend
// that sends part of a message and stops stalls only its own connection
// (a blocking MSG_WAITALL read would let one byte stop the daemon).
class MessageReader {
 public:
  enum class Result {
    kMessage,  // *m holds one whole message; call again, more may follow
    kAgain,    // nothing more to read now
    kClosed,   // EOF; *err empty between messages, else why
    kError,    // a transport error or a malformed header: *err
  };
  Result Read(int sock, Message* m, std::string* err);
  // Bytes of an incomplete message are held.
  bool partial() const { return hdr_got_ != 0; }

 private:
  Header hdr_{};
  size_t hdr_got_ = 0;
  std::vector<uint8_t> payload_;
  size_t payload_got_ = 0;
  std::vector<Fd> fds_;
};

// Returns the name of a memfd ("vstellar-doorbell-1") or "" for other files.
std::string MemfdName(int fd);

// Whether a memfd name is a doorbell region's, and its id (0: no "-<id>").
bool ParseDoorbellName(const std::string& name, uint32_t* id);

}  // namespace vstellard
