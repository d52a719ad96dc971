#include "checkpoint/fp8_state.h"

#include <bit>
#include <cstdint>
#include <vector>

#include "checkpoint/json_fields.h"
#include "core/error.h"

namespace mt::checkpoint {

namespace {

constexpr const char* kOperands[] = {"input", "weight", "grad"};

model::Fp8TensorState& operand(model::Fp8LinearState& l, int i) { return i == 0 ? l.input : i == 1 ? l.weight : l.grad; }

nlohmann::json bits_of(const Tensor& t) {
  nlohmann::json a = nlohmann::json::array();
  for (float v : t.to_device(Device::CPU).to_vector()) a.push_back(std::bit_cast<uint32_t>(v));
  return a;
}

std::vector<float> floats_of(const nlohmann::json& a, size_t n, const std::string& what) {
  if (!a.is_array() || a.size() != n)
    fail("{}: expected an array of {} float bit patterns, got {}", what, n, json_brief(a));
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = std::bit_cast<float>(static_cast<uint32_t>(json_int(a[i], what, 0, UINT32_MAX)));
  return v;
}

}  // namespace

nlohmann::json fp8_state_to_json(model::Fp8Store& store) {
  nlohmann::json j = nlohmann::json::object();
  for (model::Fp8LinearState& l : store.linears()) {
    nlohmann::json e = nlohmann::json::object();
    for (int i = 0; i < 3; ++i) {
      const model::Fp8TensorState& s = operand(l, i);
      e[kOperands[i]] = {{"scale", bits_of(s.scale)[0]}, {"history", bits_of(s.history)}};
    }
    j[l.name] = std::move(e);
  }
  return j;
}

size_t fp8_state_from_json(model::Fp8Store& store, const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) fail("{}: fp8 must be an object, got {}", where, json_brief(j));
  size_t loaded = 0;
  for (model::Fp8LinearState& l : store.linears()) {
    if (!j.contains(l.name)) continue;
    JsonFields e(j.at(l.name), where + ": fp8 '" + l.name + "'");
    for (int i = 0; i < 3; ++i) {
      model::Fp8TensorState& s = operand(l, i);
      JsonFields o(e.at(kOperands[i]), e.what(kOperands[i]));
      const size_t L = static_cast<size_t>(s.history.numel());
      if (o.at("history").is_array() && o.at("history").size() != L)
        fail("{}: the checkpoint's amax history holds {} amaxes, --fp8-amax-history-len is {}: resume with the same "
             "length",
             o.where(), o.at("history").size(), L);
      const Device d = s.scale.device();
      s.history = Tensor::from_vector(floats_of(o.at("history"), L, o.what("history")), {static_cast<int64_t>(L)})
                      .to_device(d);
      s.scale = Tensor::from_vector(floats_of(nlohmann::json::array({o.at("scale")}), 1, o.what("scale")), {1})
                    .to_device(d);
    }
    ++loaded;
  }
  store.weights_changed();
  return loaded;
}

}  // namespace mt::checkpoint
