// libFuzzer target: a native checkpoint's metadata.json and state.json (the same bytes are tried
// as both). What parse_metadata accepts must be safe for the loader's copy loop: every piece is
// copied into a whole-tensor buffer as fill() would (small tensors only), so a box or flat range
// that reaches outside its tensor shows up as an ASan report. A state.json it accepts must give
// model arguments that read into a TransformerConfig (finalize() may still refuse them cleanly).
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/io_util.h"
#include "checkpoint/metadata.h"
#include "checkpoint/model_args.h"
#include "checkpoint/slices.h"
#include "core/error.h"

namespace ck = mt::checkpoint;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  nlohmann::json j;
  try {
    j = ck::parse_json_text(text, "fuzz.json");
  } catch (const mt::Error&) {
    return 0;
  }
  try {
    const ck::Metadata md = ck::parse_metadata(j, "metadata.json");
    for (const auto& [name, t] : md.tensors) {
      const int64_t n = mt::shape_numel(t.shape);
      if (n > (1 << 16)) continue;
      std::vector<float> dst(static_cast<size_t>(n));
      const ck::Box whole{std::vector<int64_t>(t.shape.size(), 0), t.shape};
      for (const auto& pc : t.pieces) {
        if (pc.numel() > (1 << 16)) continue;
        std::vector<float> src(static_cast<size_t>(pc.numel()), 1.f);
        ck::copy_overlap(pc.box, pc.flat_lo, pc.flat_hi, src.data(), whole, 0, n, dst.data());
      }
    }
  } catch (const mt::Error&) {
  }
  for (int64_t it : {ck::kReleaseIteration, int64_t{0}, int64_t{10}}) {
    try {
      const ck::TrainingState st = ck::parse_state(j, "state.json", it);
      mt::model::TransformerConfig c;
      mt::data::TokenizerOptions t;
      ck::model_args_from_json(st.args, c, t);
      c.finalize();
    } catch (const mt::Error&) {
    }
  }
  return 0;
}
