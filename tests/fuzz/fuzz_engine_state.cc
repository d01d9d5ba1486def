// Fuzz target: a live migration's engine state into a new engine
// (Engine::restore, qemu-device/engine/src/save_restore.cc). The state
// comes from another host through QEMU's migration stream.
//
// The state is a real one, built once: the fixture's two engines
// (fuzz_engine_pair.h) in the middle of WRITEs, SENDs, READs and
// fetch-and-adds both ways, with a's last answers lost, and a's objects and
// b's saved at one moment. The input edits a's:
//   records of  off(2, big-endian) byte(1): the byte at off (modulo the
//   state's length) becomes byte;
//   a last, incomplete record of 1 or 2 bytes: the state is cut to
//   length * its first byte / 256.
// The empty input is the state as saved. Each run restores b's state
// intact and a's edited into two new engines on a network of their own,
// and, if a's is taken, runs them for 5 ms of virtual time.
//
// What counts as a bug: a sanitizer report, a crash, a hang (libFuzzer's
// -timeout), a refusal with something made, or a byte written outside the
// MRs (their translators map the MRs' buffers only, as a device's map its
// guest's memory: a damaged MR range reaches nothing else).
#include <cerrno>
#include <map>
#include <string>

#include "fuzz_engine_pair.h"

using namespace fuzz;

namespace {

// The MR's bytes of one side and nothing else.
class MrMemory final : public MemoryTranslator {
 public:
  explicit MrMemory(Side& s) : base_(s.buf.data() + kGuard), iova_(s.mr_addr()) {}
  TranslateResult translate(uint64_t iova, uint64_t len, bool, HostSpan* out, size_t max_out) override {
    TranslateResult r;
    const uint64_t off = iova - iova_;
    if (max_out == 0 || iova < iova_ || off > kMrSize || len > kMrSize - off) return r;
    out[0] = {base_ + off, size_t(len)};
    r.count = 1;
    r.covered = len;
    r.ok = true;
    return r;
  }

 private:
  uint8_t* base_;
  uint64_t iova_;
};

EngineObjects ObjectsOf(Side& s) {
  QpAttr attr;
  QpInitAttr init;
  s.eng->query_qp(s.qp, attr, init);
  EngineObjects o;
  o.pds = {s.qp->pd()};
  o.cqs = {init.send_cq};
  if (init.recv_cq != init.send_cq) o.cqs.push_back(init.recv_cq);
  o.mrs = {s.mr};
  o.qps = {s.qp};
  return o;
}

int Post(Side& s, Side& peer, WrOpcode op, uint64_t loff, uint32_t len, uint64_t roff) {
  Sge sg{s.mr_addr() + loff, len, s.mr->lkey()};
  SendWr wr;
  wr.opcode = op;
  wr.send_flags = SEND_SIGNALED;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.remote_addr = peer.mr_addr() + roff;
  wr.rkey = peer.mr->rkey();
  wr.compare_add = 1;
  return s.eng->post_send(s.qp, wr);
}

int PostRecv(Side& s, uint64_t off, uint32_t len) {
  Sge sg{s.mr_addr() + off, len, s.mr->lkey()};
  RecvWr wr;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  return s.eng->post_recv(s.qp, wr);
}

struct Saved {
  FuzzPair t;
  std::vector<uint8_t> a, b;
  EngineConfig cfg_a, cfg_b;

  Saved() {
    for (Side* s : {&t.a, &t.b}) {
      Side& peer = s == &t.a ? t.b : t.a;
      for (int i = 0; i < 2; i++)
        if (PostRecv(peer, 32768 + 4096 * i, 4096)) abort();
      if (Post(*s, peer, WrOpcode::RDMA_WRITE, 0, 16384, 16384) || Post(*s, peer, WrOpcode::SEND, 0, 4096, 0) ||
          Post(*s, peer, WrOpcode::RDMA_READ, 49152, 8192, 0) ||
          Post(*s, peer, WrOpcode::ATOMIC_FETCH_AND_ADD, 60000, 8, 65528) ||
          Post(*s, peer, WrOpcode::SEND, 4096, 4096, 0))
        abort();
    }
    // Requests on their way and some answers back; then a's answers lost.
    t.net.impairment.delay_ns = 50'000;
    t.net.run_for(60'000);
    t.net.tap = [](uint32_t from, uint32_t, uint16_t, std::vector<uint8_t>&) { return from != kIpA; };
    t.net.run_for(30'000);
    auto save_mem = [this](MemoryTranslator& m, std::vector<uint8_t>* out) {
      out->push_back(&m == &t.a.mr->mem() ? 'A' : 'B');
      return true;
    };
    if (t.a.eng->save(ObjectsOf(t.a), save_mem, &a) || t.b.eng->save(ObjectsOf(t.b), save_mem, &b)) abort();
    cfg_a = t.a.eng->config();
    cfg_b = t.b.eng->config();
  }

  Engine::RestoreMem restore_mem() {
    return [this](const uint8_t* p, size_t n) -> std::shared_ptr<MemoryTranslator> {
      if (n != 1 || (p[0] != 'A' && p[0] != 'B')) return nullptr;
      return std::make_shared<MrMemory>(p[0] == 'A' ? t.a : t.b);
    };
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Saved saved;
  std::vector<uint8_t> state = saved.a;
  size_t pos = 0;
  for (; pos + 3 <= size; pos += 3) state[(size_t(data[pos]) << 8 | data[pos + 1]) % state.size()] = data[pos + 2];
  if (pos < size) state.resize(state.size() * data[pos] / 256);

  SimNet net(3);
  Engine ea(saved.cfg_a, net.add_node(kIpA), net);
  Engine eb(saved.cfg_b, net.add_node(kIpB), net);
  net.attach(kIpA, &ea);
  net.attach(kIpB, &eb);
  EngineObjects got;
  std::string err;
  if (eb.restore(saved.b.data(), saved.b.size(), saved.restore_mem(), 0, &got, &err)) abort();  // the fixture
  // Within 64 MiB, as a device's budget bounds it (an edited count may ask
  // for the largest CQs and QPs: ENOMEM, not an allocation that large).
  const int rc = ea.restore(state.data(), state.size(), saved.restore_mem(), 0, &got, &err, size_t{64} << 20);
  if (rc != 0) {
    if ((rc != EPROTO && rc != EINVAL && rc != ENOMEM) || err.empty() || !ea.describe_qps().empty() || ea.active_qps()) abort();
    return 0;
  }
  net.run_for(5'000'000);
  if (!saved.t.a.guards_clean() || !saved.t.b.guards_clean()) abort();  // wrote outside the MRs
  return 0;
}
