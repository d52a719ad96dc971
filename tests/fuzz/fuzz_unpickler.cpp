// libFuzzer target: the restricted unpickler (checkpoint/megatron/pickle.h) and what reads its
// trees: PyTorch distributed checkpoint metadata, and torch.save archives (the stored-zip reader,
// storages and tensor rebuilds). The bytes are tried as a pickle and as a torch.save archive.
#include <cstdint>

#include "checkpoint/megatron/dcp.h"
#include "checkpoint/megatron/pickle.h"
#include "checkpoint/megatron/torch_zip.h"
#include "core/error.h"

namespace mc = mt::checkpoint;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    mc::pickle::Pickle p = mc::pickle::parse(data, size, "fuzz.pkl");
    try {
      (void)mc::megatron::parse_dcp_metadata(p, "fuzz.pkl");
    } catch (const mt::Error&) {
    }
  } catch (const mt::Error&) {
    // A clean refusal.
  }
  try {
    mc::megatron::TorchSave ts(mc::megatron::Bytes{data, size}, "fuzz.pt");
    const auto& pk = ts.pickle();
    for (int64_t n = 0; n < static_cast<int64_t>(pk.nodes.size()); ++n) {
      if (!ts.is_tensor(n)) continue;
      try {
        (void)ts.tensor(n, "t");
      } catch (const mt::Error&) {
      }
      try {
        (void)ts.number(n, "t");
      } catch (const mt::Error&) {
      }
    }
  } catch (const mt::Error&) {
  }
  return 0;
}
