// Every op of ops.def through the ops:: dispatch, on the GPU against the CPU (after ggml's
// test-backend-ops): one table of cases, each building its inputs on a device from the same host
// values (rounded to bf16, the GPU's storage: the CPU sees the same numbers in fp32) and running
// the op there; the outputs of the two devices are compared in relative L2 error. The launcher
// tests (cuda_*_test.cpp) check the kernels' paths and bits; this checks that each op reaches
// them with the right shapes, dtypes and layouts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/fp8_codes.h"
#include "kernels/ops.h"
#include "support/gpu.h"
#include "test_util.h"

namespace mt::ops {
namespace {

using Outputs = std::vector<Tensor>;

// Activations and weights: bf16 on the GPU, fp32 on the CPU, the same (bf16-exact) values.
Tensor act(Device d, const Shape& s, uint64_t seed, double lo = -1, double hi = 1) {
  const Tensor t = Tensor::from_vector(test::rounded(test::random_vec<float>(shape_numel(s), seed, lo, hi)), s);
  return d == Device::CPU ? t : t.to(DType::BF16).to_device(d);
}
// fp32 tensors on both devices (statistics, main grads, tables, dloss).
Tensor f32(Device d, const std::vector<float>& v, const Shape& s) { return Tensor::from_vector(v, s).to_device(d); }
Tensor f32(Device d, const Shape& s, uint64_t seed) { return f32(d, test::random_vec<float>(shape_numel(s), seed), s); }
Tensor ids(Device d, const std::vector<int32_t>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}).to_device(d);
}
std::vector<float> host(const Tensor& t) { return t.to_device(Device::CPU).to_vector(); }
// fp16 on the GPU (the --fp16 storage), the same bf16-exact values in fp32 on the CPU.
Tensor act16(Device d, const Shape& s, uint64_t seed) {
  const Tensor t = act(Device::CPU, s, seed);
  return d == Device::CPU ? t : t.to(DType::F16).to_device(d);
}
Tensor i32(Device d, const std::vector<int32_t>& v, const Shape& s) { return Tensor::from_vector(v, s).to_device(d); }

// FP8 codes (U8) read as their values, on the CPU.
Tensor decoded(const Tensor& codes, Fp8Format f) {
  const Tensor h = codes.to_device(Device::CPU);
  std::vector<float> v(static_cast<size_t>(h.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = fp8_decode(h.data<uint8_t>()[i], f);
  return Tensor::from_vector(v, h.shape());
}

// ---- MoE inputs.
// Router logits [n, E] (E coprime with 5): each row a permutation of a grid of step 0.3 to 0.5,
// shifted by up to 0.5, so a row's values lie at least 0.3 apart (no near-ties: both devices
// choose the same experts, also through softmax and sigmoid, which keep the order).
Tensor router_logits(Device d, int64_t n, int64_t E, uint64_t seed) {
  const std::vector<float> step = test::random_vec<float>(n, seed, 0.3, 0.5);
  const std::vector<float> shift = test::random_vec<float>(n, seed + 1, -0.5, 0.5);
  std::vector<float> v(n * E);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t e = 0; e < E; ++e)
      v[t * E + e] = step[t] * (static_cast<float>((5 * e + 7 * t) % E) - 0.5f * E) + shift[t];
  return f32(d, v, {n, E});
}
// A routing map [n, E] made on the host: token t goes to expert t^2 % E (uneven loads: experts
// 0, 1 and 4 of 8 take most tokens) and to one of the next three; each token to two experts.
std::vector<int32_t> moe_map(int64_t n, int64_t E) {
  std::vector<int32_t> m(n * E, 0);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t e1 = t * t % E;
    m[t * E + e1] = 1;
    m[t * E + (e1 + 1 + t % 3) % E] = 1;
  }
  return m;
}
// Distinct probs in (0.05, 1) where the map is 1, 0 elsewhere (the same bits on both devices).
std::vector<float> moe_probs(const std::vector<int32_t>& map, uint64_t seed) {
  std::vector<float> p = test::random_vec<float>(map.size(), seed, 0.05, 1.0);
  for (size_t i = 0; i < p.size(); ++i)
    if (!map[i]) p[i] = 0.f;
  return p;
}

struct Case {
  std::string name;
  double tol;  // relative L2 error of each output (I32 outputs must be equal)
  std::function<Outputs(Device)> run;
};

// ---- Mixture of experts. Router tensors are f32 on both devices; the I32 outputs (choices,
// maps, dispatch rows, counts) must agree exactly.
void add_moe_cases(std::vector<Case>& c) {
  using Score = RouterSpec::Score;
  using test::router_spec;
  const int64_t T = 64, E = 8, B = 2;
  c.push_back({"moe_route_softmax", 1e-4, [=](Device d) {
                 const Tensor l = router_logits(d, T, E, 60), dprobs = f32(d, {T, E}, 61);
                 const RouterSpec top2 = router_spec(E, 2);
                 RouterSpec pre = router_spec(E, 3);
                 pre.pre_softmax = true;
                 pre.scaling = 2.5f;
                 Tensor p, s, p2, s2;
                 moe_route(l, nullptr, top2, p, s);
                 moe_route(l, nullptr, pre, p2, s2);
                 return Outputs{p,  s,  moe_route_backward(l, s, dprobs, top2),
                                p2, s2, moe_route_backward(l, s2, dprobs, pre)};
               }});
  // Expert bias +1 on expert 2 (always chosen), -1 on expert 5 (never): it moves the choice by
  // more than any gap between sigmoids, so no near-ties.
  c.push_back({"moe_route_sigmoid", 1e-4, [=](Device d) {
                 const Tensor l = router_logits(d, T, E, 62), dprobs = f32(d, {T, E}, 63);
                 const Tensor bias = f32(d, std::vector<float>{0, 0, 1, 0, 0, -1, 0, 0}, {E});
                 const RouterSpec k2 = router_spec(E, 2, Score::Sigmoid), k1 = router_spec(E, 1, Score::Sigmoid);
                 RouterSpec grouped = router_spec(E, 2, Score::Sigmoid);  // 4 groups of 2, the best 2 groups
                 grouped.num_groups = 4;
                 grouped.group_topk = 2;
                 Tensor p, s, p1, s1, pg, sg;
                 moe_route(l, &bias, k2, p, s);
                 moe_route(l, nullptr, k1, p1, s1);
                 moe_route(l, &bias, grouped, pg, sg);
                 return Outputs{p,  s,  moe_route_backward(l, s, dprobs, k2),
                                p1, s1, moe_route_backward(l, s1, dprobs, k1),
                                pg, sg, moe_route_backward(l, sg, dprobs, grouped)};
               }});
  // Sinkhorn with tol 0: both devices run the same number of rounds.
  c.push_back({"moe_route_sinkhorn", 1e-4, [=](Device d) {
                 const Tensor l = router_logits(d, T, E, 64), dprobs = f32(d, {T, E}, 65);
                 Outputs out;
                 for (int64_t k : {1, 2}) {
                   RouterSpec sp = router_spec(E, k);
                   sp.sinkhorn = true;
                   sp.sinkhorn_tol = 0.f;
                   sp.max_sinkhorn_iters = 40;
                   Tensor p, s;
                   moe_route(l, nullptr, sp, p, s);
                   out.insert(out.end(), {p, s, moe_route_backward(l, s, dprobs, sp)});
                 }
                 return out;
               }});
  c.push_back({"moe_aux", 1e-4, [=](Device d) {
                 const Tensor l = router_logits(d, T, E, 66), coef = f32(d, {B, E}, 67);
                 Outputs out;
                 for (Score score : {Score::Softmax, Score::Sigmoid}) {
                   const RouterSpec sp = router_spec(E, 2, score);
                   Tensor sums, counts, z, dl = f32(d, {T, E}, 68);
                   moe_aux_stats(l, sp, B, sums, counts, z);
                   moe_aux_backward(l, sp, B, coef, 0.37f, dl);
                   out.insert(out.end(), {sums, counts, z, dl});
                 }
                 return out;
               }});
  const std::vector<int32_t> map = moe_map(T, E);
  const std::vector<float> probs = moe_probs(map, 69);
  // Dropping by prob and by position (capacity 10 of up to 32 tokens), and padding to 12.
  c.push_back({"moe_capacity", 1e-6, [=](Device d) {
                 Outputs out;
                 for (int mode = 0; mode < 3; ++mode) {
                   Tensor p = f32(d, probs, {T, E});
                   const Tensor m = moe_capacity(p, i32(d, map, {T, E}), mode == 2 ? 12 : 10, mode == 1, mode == 2);
                   out.insert(out.end(), {m, p});
                 }
                 return out;
               }});
  // Several chunks of tokens (the GPU's scan) and a map with holes (after dropping).
  c.push_back({"moe_dispatch_plan", 1e-6, [=](Device d) {
                 const int64_t n = 700, e = 6;
                 Tensor counts, counts2, p = f32(d, probs, {T, E});
                 const Tensor rows = moe_dispatch_plan(i32(d, moe_map(n, e), {n, e}), counts);
                 const Tensor dropped = moe_capacity(p, i32(d, map, {T, E}), 10, false, false);
                 const Tensor rows2 = moe_dispatch_plan(dropped, counts2);
                 return Outputs{rows, counts, rows2, counts2};
               }});
  // The permutation family on the plan of the host map: bf16 and fp16 with 16-byte vectors, bf16
  // with an odd hidden size (scalar path), f32.
  struct Io {
    const char* name;
    int64_t h;
    double tol;
    Tensor (*make)(Device, const Shape&, uint64_t);
  };
  const Io ios[] = {
      {"moe_permute_bf16", 64, 1e-2, [](Device d, const Shape& s, uint64_t seed) { return act(d, s, seed); }},
      {"moe_permute_bf16_odd_h", 36, 1e-2, [](Device d, const Shape& s, uint64_t seed) { return act(d, s, seed); }},
      {"moe_permute_f16", 64, 1e-2, act16},
      {"moe_permute_f32", 37, 1e-5, [](Device d, const Shape& s, uint64_t seed) { return f32(d, s, seed); }},
  };
  for (const Io& io : ios)
    c.push_back({io.name, io.tol, [=](Device d) {
                   Tensor counts, dprobs;
                   const Tensor rows = moe_dispatch_plan(i32(d, map, {T, E}), counts);
                   const int64_t R = 2 * T;  // two experts per token
                   const Tensor pr = f32(d, probs, {T, E});
                   const Tensor x = io.make(d, {T, io.h}, 70), yp = io.make(d, {R, io.h}, 71);
                   const Tensor dy = io.make(d, {T, io.h}, 72);
                   const Tensor dyp = moe_unpermute_backward(dy, yp, rows, pr, dprobs);
                   return Outputs{moe_permute(x, rows, R), moe_permute_backward(yp, rows), moe_unpermute(yp, rows, pr),
                                  dyp, dprobs};
                 }});
  // The shared expert's gate, f32 or in the activations' type.
  c.push_back({"sigmoid_gate_rows", 1e-2, [=](Device d) {
                 const Tensor x = act(d, {T, 64}, 73), dy = act(d, {T, 64}, 74);
                 const Tensor gate = f32(d, {T, 1}, 75), gate_half = act(d, {T, 1}, 76, -3, 3);
                 Tensor dgate, dgate2;
                 const Tensor dx = sigmoid_gate_rows_backward(dy, x, gate, dgate);
                 const Tensor dx2 = sigmoid_gate_rows_backward(dy, x, gate_half, dgate2);
                 return Outputs{sigmoid_gate_rows(x, gate), dx, dgate, sigmoid_gate_rows(x, gate_half), dx2, dgate2};
               }});
  c.push_back({"sigmoid_gate_rows_f32", 1e-5, [=](Device d) {
                 const Tensor x = f32(d, {T, 37}, 77), dy = f32(d, {T, 37}, 78), gate = f32(d, {T, 1}, 79);
                 Tensor dgate;
                 const Tensor dx = sigmoid_gate_rows_backward(dy, x, gate, dgate);
                 return Outputs{sigmoid_gate_rows(x, gate), dx, dgate};
               }});
}

std::vector<Case> cases() {
  const int64_t rows = 64, in = 96, out = 80, S = 16, B = 2, G = 2, qpg = 2, D = 64, V = 1000;
  std::vector<Case> c;
  c.push_back({"linear_forward", 1e-2, [=](Device d) {
                 const Tensor b = act(d, {out}, 3);
                 return Outputs{linear_forward(act(d, {rows, in}, 1), act(d, {out, in}, 2), &b)};
               }});
  c.push_back({"linear_forward_residual", 1e-2, [=](Device d) {
                 return Outputs{linear_forward_residual(act(d, {rows, in}, 1), act(d, {out, in}, 2), nullptr,
                                                        act(d, {rows, out}, 4))};
               }});
  c.push_back({"linear_forward_into", 1e-2, [=](Device d) {
                 Tensor y = act(d, {rows, out}, 5);
                 linear_forward_into(act(d, {rows, in}, 1), act(d, {out, in}, 2), nullptr, y);
                 return Outputs{y};
               }});
  c.push_back({"linear_backward", 1e-2, [=](Device d) {
                 Tensor dw = f32(d, {out, in}, 6), db = f32(d, {out}, 7);
                 const Tensor dx =
                     linear_backward(act(d, {rows, out}, 8), act(d, {rows, in}, 1), act(d, {out, in}, 2), dw, &db);
                 return Outputs{dx, dw, db};
               }});
  c.push_back({"linear_backward_data_weight", 1e-2, [=](Device d) {
                 Tensor dw = f32(d, {out, in}, 6);
                 const Tensor dy = act(d, {rows, out}, 8);
                 const Tensor dx = linear_backward_data(dy, act(d, {out, in}, 2));
                 linear_backward_weight(dy, act(d, {rows, in}, 1), dw, nullptr, /*accumulate_dw=*/false);
                 return Outputs{dx, dw};
               }});
  c.push_back({"linear_backward_data_into", 1e-2, [=](Device d) {
                 Tensor dx = act(d, {rows + 8, in}, 5);  // rows [4, 4 + rows) written, the rest kept
                 Tensor slice = dx.slice(4, rows);
                 linear_backward_data_into(act(d, {rows, out}, 8), act(d, {out, in}, 2), slice);
                 return Outputs{dx};
               }});
  c.push_back({"moe_expert_bias_update", 1e-7, [=](Device d) {
                 // Counts above, at and below their mean (10): -rate, 0, +rate.
                 Tensor bias = f32(d, {5}, 40);
                 const std::vector<float> counts{12, 10, 3, 25, 0};
                 moe_expert_bias_update(bias, upload(counts.data(), {5}, DType::F32, d), 1e-3f);
                 return Outputs{bias};
               }});
  c.push_back({"grouped_linear", 1e-2, [=](Device d) {
                 // Four groups, one empty, of uneven rows; dw accumulates into non-zero values.
                 const std::vector<int64_t> counts{17, 0, 40, 7};
                 const int64_t n = 64;
                 const Tensor x = act(d, {n, in}, 1), dy = act(d, {n, out}, 8);
                 std::vector<Tensor> w, dw;
                 for (int g = 0; g < 4; ++g) {
                   w.push_back(act(d, {out, in}, 20 + g));
                   dw.push_back(f32(d, {out, in}, 30 + g));
                 }
                 std::vector<const Tensor*> wp;
                 std::vector<Tensor*> dwp;
                 for (int g = 0; g < 4; ++g) wp.push_back(&w[g]), dwp.push_back(&dw[g]);
                 Tensor y = act(d, {n, out}, 5), dx = act(d, {n, in}, 6);
                 grouped_linear_forward(x, wp, counts, y);
                 grouped_linear_backward(dy, x, wp, dwp, counts, {true, true, false, true}, dx);  // group 2 overwrites
                 return Outputs{y, dx, dw[0], dw[1], dw[2], dw[3]};
               }});
  c.push_back({"grouped_linear_backward_deferred", 1e-2, [=](Device d) {
                 // The weight gradients left running (GPU) while the inputs' last handles go:
                 // they must stay allocated and dw must be complete after the join.
                 const std::vector<int64_t> counts{9, 30, 0, 25};
                 const int64_t n = 64;
                 std::vector<Tensor> w, dw;
                 for (int g = 0; g < 4; ++g) {
                   w.push_back(act(d, {out, in}, 40 + g));
                   dw.push_back(f32(d, {out, in}, 50 + g));
                 }
                 std::vector<const Tensor*> wp;
                 std::vector<Tensor*> dwp;
                 for (int g = 0; g < 4; ++g) wp.push_back(&w[g]), dwp.push_back(&dw[g]);
                 Tensor dx = act(d, {n, in}, 6);
                 {
                   const Tensor x = act(d, {n, in}, 44), dy = act(d, {n, out}, 45);
                   grouped_linear_backward(dy, x, wp, dwp, counts, {false, true, true, true}, dx, /*defer_wgrad=*/true);
                 }
                 const Tensor scratch = act(d, {n, out}, 46);  // may reuse freed memory: must not
                 join_deferred_work(d);
                 return Outputs{dx, dw[0], dw[1], dw[2], dw[3], scratch};
               }});
  c.push_back({"embedding", 1e-2, [=](Device d) {
                 const Tensor id = ids(d, {3, 0, 7, 3, 49, 12});
                 Tensor dtable = f32(d, {50, D}, 9);
                 embedding_backward(id, act(d, {6, D}, 10), dtable);
                 return Outputs{embedding_forward(id, act(d, {50, D}, 11)), dtable};
               }});
  c.push_back({"position_embedding", 1e-2, [=](Device d) {
                 Tensor x = act(d, {S * B, D}, 12);
                 add_position_embedding(x, act(d, {S, D}, 13), S, B);
                 Tensor dpe = f32(d, {S, D}, 14);
                 position_embedding_backward(act(d, {S * B, D}, 15), dpe, S, B);
                 return Outputs{x, dpe};
               }});
  c.push_back({"vocab_embedding", 1e-2, [=](Device d) {
                 const Tensor id = ids(d, {3, 20, 27, 25, 49, 21});
                 Tensor dtable = f32(d, {25, D}, 16);
                 vocab_embedding_backward(id, act(d, {6, D}, 17), dtable, 20);
                 return Outputs{vocab_embedding_forward(id, act(d, {25, D}, 18), 20), dtable};
               }});
  c.push_back({"rmsnorm", 2e-2, [=](Device d) {
                 const Tensor x = act(d, {rows, 256}, 19), w = act(d, {256}, 20, 0.5, 1.5);
                 const Tensor dx_add = act(d, {rows, 256}, 22);
                 Tensor rstd, dw = f32(d, {256}, 21);
                 const Tensor y = rmsnorm_forward(x, w, 1e-5f, rstd);
                 const Tensor dx = rmsnorm_backward(act(d, {rows, 256}, 23), x, w, rstd, dw, &dx_add);
                 return Outputs{y, rstd, dx, dw};
               }});
  c.push_back({"layernorm", 2e-2, [=](Device d) {
                 const Tensor x = act(d, {rows, 256}, 24, 1, 3), w = act(d, {256}, 25, 0.5, 1.5);
                 const Tensor b = act(d, {256}, 26);
                 Tensor mean, rstd, dw = f32(d, {256}, 27), db = f32(d, {256}, 28);
                 const Tensor y = layernorm_forward(x, w, b, 1e-5f, mean, rstd);
                 const Tensor dx = layernorm_backward(act(d, {rows, 256}, 29), x, w, mean, rstd, dw, db);
                 return Outputs{y, mean, rstd, dx, dw, db};
               }});
  c.push_back({"add_norms", 2e-2, [=](Device d) {
                 const Tensor x = act(d, {rows, 256}, 30), r = act(d, {rows, 256}, 31);
                 const Tensor w = act(d, {256}, 32, 0.5, 1.5), b = act(d, {256}, 33);
                 Tensor rstd, sum, mean, rstd2, sum2;
                 const Tensor y = add_rmsnorm_forward(x, r, w, 1e-5f, rstd, sum);
                 const Tensor y2 = add_layernorm_forward(x, r, w, b, 1e-5f, mean, rstd2, sum2);
                 return Outputs{y, rstd, sum, y2, mean, rstd2, sum2};
               }});
  c.push_back({"qkv_split_merge_rope", 2e-2, [=](Device d) {
                 std::vector<float> cs(S * D / 2), sn(S * D / 2);
                 cpu::rope_tables(S, D, 10000.0, cs.data(), sn.data());
                 const Tensor cos = f32(d, cs, {S, D / 2}), sin = f32(d, sn, {S, D / 2});
                 const RopeRef rope{&cos, &sin, D};
                 Tensor q, k, v;
                 qkv_split(act(d, {S * B, G * (qpg + 2) * D}, 34), q, k, v, S, B, G, qpg, D, rope);
                 const Tensor qs = q.clone(), ks = k.clone();  // the merge may rotate q and k in place
                 const Tensor packed = qkv_merge(q, k, v, S, B, G, qpg, D, rope);
                 return Outputs{qs, ks, v, packed};
               }});
  c.push_back({"rope", 2e-2, [=](Device d) {
                 std::vector<float> cs(S * 16), sn(S * 16);
                 cpu::rope_tables(S, 32, 10000.0, cs.data(), sn.data());
                 const Tensor cos = f32(d, cs, {S, 16}), sin = f32(d, sn, {S, 16});
                 Tensor x = act(d, {B, 4, S, D}, 35), dx = act(d, {B, 4, S, D}, 36);
                 rope_forward(x, cos, sin, 32);
                 rope_backward(dx, cos, sin, 32);
                 return Outputs{x, dx};
               }});
  c.push_back({"heads_rows", 1e-2, [=](Device d) {
                 const Tensor h = act(d, {B, 4, S, D}, 37), r = act(d, {S * B, 4 * D}, 38);
                 return Outputs{heads_to_rows(h, S, B, 4, D), rows_to_heads(r, S, B, 4, D)};
               }});
  // Attention in both layouts of its output, from the same inputs (GQA: 4 query heads, 2 kv heads).
  c.push_back({"attention", 3e-2, [=](Device d) {
                 const AttentionShape p{B, 4, 2, 64, D, 1.f / std::sqrt(static_cast<float>(D))};
                 const Tensor q = act(d, {B, 4, 64, D}, 39), k = act(d, {B, 2, 64, D}, 40);
                 const Tensor v = act(d, {B, 2, 64, D}, 41), dout = act(d, {B, 4, 64, D}, 42);
                 Tensor o, lse, dq, dk, dv, o_rows, lse_rows, dq_rows, dk_rows, dv_rows;
                 attention_forward(p, q, k, v, o, lse);
                 attention_backward(p, q, k, v, o, lse, dout, dq, dk, dv);
                 attention_forward_rows(p, q, k, v, o_rows, lse_rows);
                 attention_backward_rows(p, q, k, v, o_rows, lse_rows, heads_to_rows(dout, 64, B, 4, D), dq_rows,
                                         dk_rows, dv_rows);
                 return Outputs{o, lse, dq, dk, dv, o_rows, lse_rows, dq_rows, dk_rows, dv_rows};
               }});
  c.push_back({"swiglu", 2e-2, [=](Device d) {
                 const Tensor h = act(d, {rows, 256}, 44, -3, 3);
                 return Outputs{swiglu_forward(h), swiglu_backward(act(d, {rows, 128}, 45), h)};
               }});
  // The FP8 producer fusion: SwiGLU (both ways) and RMSNorm (plain and after the residual add)
  // writing their output's amax in the same pass, and SwiGLU (both ways) writing FP8 codes; the
  // CPU composes each op with fp8_amax or fp8_cast_transpose.
  c.push_back({"fp8_producer", 2e-2, [=](Device d) {
                 const Tensor h = act(d, {rows, 256}, 48, -3, 3), dy = act(d, {rows, 128}, 49);
                 const Tensor x = act(d, {rows, in}, 50, -2, 2), res = act(d, {rows, in}, 51), w = act(d, {in}, 52);
                 auto scalar = [&] { return Tensor::zeros({1}, DType::F32, d); };
                 Tensor a_fwd = scalar(), a_bwd = scalar(), a_norm = scalar(), a_add = scalar(), rstd, rstd2, sum;
                 const Tensor y = swiglu_forward(h, &a_fwd), dh = swiglu_backward(dy, h, &a_bwd);
                 const Tensor n = rmsnorm_forward(x, w, 1e-5f, rstd, &a_norm);
                 const Tensor n2 = add_rmsnorm_forward(x, res, w, 1e-5f, rstd2, sum, &a_add);
                 // Delayed scaling's fused casts (codes compared as their values).
                 const Tensor sc = f32(d, std::vector<float>{100.f}, {1});
                 Tensor q = Tensor::empty({rows, 128}, DType::U8, d), qt = Tensor::empty({128, rows}, DType::U8, d);
                 Tensor gq = Tensor::empty({rows, 256}, DType::U8, d), gqt = Tensor::empty({256, rows}, DType::U8, d);
                 Tensor c_amax = scalar(), g_amax = scalar(), sat = Tensor::zeros({1}, DType::I64, d);
                 swiglu_forward_fp8(h, sc, Fp8Format::E4M3, q, &qt, c_amax, sat);
                 swiglu_backward_fp8(dy, h, sc, Fp8Format::E5M2, gq, &gqt, g_amax, sat);
                 return Outputs{y, a_fwd, dh, a_bwd, n, a_norm, n2, sum, a_add, decoded(q, Fp8Format::E4M3),
                                decoded(qt, Fp8Format::E4M3), c_amax, decoded(gq, Fp8Format::E5M2),
                                decoded(gqt, Fp8Format::E5M2), g_amax};
               }});
  c.push_back({"gelu", 2e-2, [=](Device d) {
                 const Tensor h = act(d, {rows, 128}, 46, -3, 3), dy = act(d, {rows, 128}, 47);
                 return Outputs{gelu_forward(h, false), gelu_backward(dy, h, false), gelu_forward(h, true),
                                gelu_backward(dy, h, true)};
               }});
  c.push_back({"dropout", 1e-2, [=](Device d) {
                 return Outputs{dropout_forward(act(d, {rows, 128}, 48), 0.25f, 7, 3),
                                dropout_backward(act(d, {rows, 128}, 49), 0.25f, 7, 3)};
               }});
  const std::vector<int32_t> targets = {0, 999, 17, 500, 3, 998, 250, 1};
  const std::vector<float> dloss = {1, 0, 0.5f, 2, 1, 1, 0.25f, 1};
  c.push_back({"cross_entropy", 2e-2, [=](Device d) {
                 const Tensor t = ids(d, targets), dl = f32(d, dloss, {8});
                 Tensor losses, lse, losses2, lse2;
                 cross_entropy_forward(act(d, {8, V}, 50, -4, 4), t, losses, lse);
                 const Tensor grad = cross_entropy_backward(act(d, {8, V}, 50, -4, 4), t, lse, dl);
                 const Tensor fused = cross_entropy_fused(act(d, {8, V}, 50, -4, 4), t, dl, losses2, lse2);
                 return Outputs{losses, lse, grad, fused, losses2, lse2};
               }});
  c.push_back({"vocab_cross_entropy", 2e-2, [=](Device d) {
                 const Tensor t = ids(d, targets), dl = f32(d, dloss, {8});
                 Tensor losses, lse;
                 vocab_cross_entropy_forward(act(d, {8, 400}, 51, -4, 4), t, 300, {}, losses, lse);
                 const Tensor grad = vocab_cross_entropy_backward(act(d, {8, 400}, 51, -4, 4), t, lse, dl, 300);
                 return Outputs{losses, lse, grad};
               }});
  c.push_back({"loss_head", 1e-6, [=](Device d) {
                 const std::vector<float> mask = {1, 0, 1, 1, 0, 1, 1, 1};
                 const Tensor m = upload(mask.data(), {8}, DType::F32, d);
                 Tensor acc = Tensor::zeros({1}, DType::I64, d);
                 accumulate_masked_loss(f32(d, dloss, {8}), m, acc);
                 double sum = 0;
                 std::memcpy(&sum, acc.to_device(Device::CPU).raw(), sizeof sum);
                 return Outputs{m, scaled_mask(m, 0.125f), Tensor::from_vector(std::vector<float>{float(sum)}, {1})};
               }});
  c.push_back({"elementwise", 1e-2, [=](Device d) {
                 Tensor y = act(d, {rows, 128}, 52);
                 add_inplace(y, act(d, {rows, 128}, 53));
                 Tensor wide = f32(d, {rows, 128}, 54);
                 cast(y, wide);
                 round_bf16_inplace(wide);  // a no-op on the GPU; the CPU rounds what bf16 would hold
                 return Outputs{y, wide};
               }});
  c.push_back({"copy_into", 1e-12, [=](Device d) {  // exact: rel L2 0 expected
                 Tensor y = act(d, {rows, 128}, 66);
                 Tensor part = y.slice(2, 3);
                 copy_into(part, act(d, {3, 128}, 67));  // rows 2..4 of y replaced, the others kept
                 return Outputs{y};
               }});
  c.push_back({"grad_norm_squared", 1e-6, [=](Device d) {
                 const double sq = grad_norm_squared(f32(d, {5000}, 55), {{4000, 5000}, {0, 1000}, {1000, 2500}});
                 return Outputs{Tensor::from_vector(std::vector<float>{static_cast<float>(sq)}, {1})};
               }});
  c.push_back({"clip_grads_unscale_and_check", 1e-6, [=](Device d) {
                 Tensor g = f32(d, {5000}, 56);
                 clip_grads(g, {{0, 1000}, {3000, 5000}}, 40.0, 10.0);  // factor 1/4 on the ranges
                 Tensor u = f32(d, {5000}, 57);
                 std::vector<float> bad = test::random_vec<float>(5000, 58);
                 bad[4500] = INFINITY;
                 Tensor b = f32(d, bad, {5000});
                 const std::vector<float> found = {float(unscale_and_check(u, {{100, 4000}}, 0.25f)),
                                                   float(unscale_and_check(b, {{0, 4000}}, 0.5f)),
                                                   float(unscale_and_check(b, {{4000, 5000}}, 0.5f))};
                 return Outputs{g, u, b.flat_range(0, {4000}), Tensor::from_vector(found, {3})};
               }});
  // Hyper-parameters that are fp32 values already, where both devices round alike (ops.def).
  const std::vector<DecaySegment> segments = {{0, 3000, true}, {3000, 3500, false}, {3500, 5000, true}};
  c.push_back({"adamw_step", 1e-6, [=](Device d) {
                 Tensor p = f32(d, {5000}, 60), m = f32(d, test::random_vec<float>(5000, 61, -0.01, 0.01), {5000});
                 Tensor v = f32(d, test::random_vec<float>(5000, 62, 0, 1e-4), {5000});
                 const HalfCopy copy{Tensor::zeros({5000}, DType::BF16, d), DType::BF16};
                 AdamWStep h;
                 h.lr = 1.0 / 128;
                 h.weight_decay = 0.25;
                 h.beta1 = 0.875;
                 h.beta2 = 1.0 - 1.0 / 128;
                 h.eps = 1.0 / (1 << 20);
                 h.step = 3;
                 h.grad_scale = 0.375f;  // clipping folded into the update
                 adamw_step(p, f32(d, {5000}, 63), m, v, segments, h, copy);
                 return Outputs{p, m, v, copy.out};
               }});
  c.push_back({"sgd_step", 1e-6, [=](Device d) {
                 Tensor p = f32(d, {5000}, 64), buf = Tensor::zeros({5000}, DType::F32, d);
                 const Tensor g = f32(d, {5000}, 65);
                 const HalfCopy copy{Tensor::zeros({5000}, DType::F16, d), DType::F16};
                 SGDStep h;
                 h.lr = 0.125;
                 h.weight_decay = 0.0625;
                 h.momentum = 0.875;
                 h.first = true;  // the momentum buffer starts as the first direction, then accumulates
                 sgd_step(p, g, &buf, segments, h, copy);
                 h.first = false;
                 h.grad_scale = 0.625f;
                 sgd_step(p, g, &buf, segments, h, copy);
                 return Outputs{p, buf, copy.out};
               }});
  c.push_back({"fp8", 1e-2, [=](Device d) {  // the scaling state exact, the read-back within bf16's rounding
                 const Tensor x = act(d, {rows, 256}, 70, -3, 3);
                 Tensor amax = f32(d, std::vector<float>{0.f}, {1}), scale = f32(d, std::vector<float>{1.f}, {1});
                 Tensor history = f32(d, std::vector<float>{0.5f, 6.f, 2.f}, {3}), dscale = f32(d, std::vector<float>{3.f}, {1});
                 Tensor sat = Tensor::zeros({1}, DType::I64, d);
                 fp8_amax(x, amax);
                 fp8_current_scale(amax, scale, 448.f);
                 const Tensor q = fp8_fake_quantize(x, scale, Fp8Format::E4M3, sat);
                 const Tensor clipped = fp8_fake_quantize(x, f32(d, std::vector<float>{4096.f}, {1}), Fp8Format::E5M2, sat);
                 fp8_delayed_update(history, dscale, amax, 448.f, 1, true);
                 Tensor s1 = Tensor::zeros({rows * 2}, DType::F32, d), s2 = Tensor::zeros({2}, DType::F32, d);
                 const Tensor rowwise = fp8_fake_quantize_blocks(x, Fp8Format::E4M3, 1, 128, s1);
                 const Tensor block = fp8_fake_quantize_blocks(x, Fp8Format::E5M2, 128, 128, s2);
                 const float n_sat = static_cast<float>(*sat.to_device(Device::CPU).data<int64_t>());
                 return Outputs{amax, scale, q, clipped, history, dscale, rowwise, s1, block, s2,
                                Tensor::from_vector(std::vector<float>{n_sat}, {1})};
               }});
  // FP8 bytes: the fused cast (+ transpose, amax, clipped count) gives the CPU's codes exactly;
  // the GEMM over them (scale_invs from the device) matches the CPU's fp32 sum within bf16.
  c.push_back({"fp8_cast_transpose_gemm", 1e-2, [=](Device d) {
                 const Tensor x = act(d, {rows, in}, 71, -3, 3), w = act(d, {in, in}, 72, -1, 1);
                 const Tensor sx = f32(d, std::vector<float>{100.f}, {1}), sw = f32(d, std::vector<float>{400.f}, {1});
                 Tensor qx = Tensor::empty({rows, in}, DType::U8, d), qxt = Tensor::empty({in, rows}, DType::U8, d);
                 Tensor qw = Tensor::empty({in, in}, DType::U8, d);
                 Tensor amax = Tensor::zeros({1}, DType::F32, d), sat = Tensor::zeros({1}, DType::I64, d);
                 fp8_cast_transpose(x, sx, Fp8Format::E4M3, qx, &qxt, amax, sat);  // 3 * 100 > 448: some clip
                 Tensor amax_w = Tensor::zeros({1}, DType::F32, d);
                 fp8_cast_transpose(w, sw, Fp8Format::E5M2, qw, nullptr, amax_w, sat);
                 const Tensor y = fp8_gemm(qx, Fp8Format::E4M3, f32(d, std::vector<float>{0.01f}, {1}), qw,
                                           Fp8Format::E5M2, f32(d, std::vector<float>{0.0025f}, {1}),
                                           d == Device::CPU ? DType::F32 : DType::BF16);
                 const float n_sat = static_cast<float>(*sat.to_device(Device::CPU).data<int64_t>());
                 return Outputs{decoded(qx, Fp8Format::E4M3), decoded(qxt, Fp8Format::E4M3),
                                decoded(qw, Fp8Format::E5M2), amax, amax_w, y,
                                Tensor::from_vector(std::vector<float>{n_sat}, {1})};
               }});
  // The GPU path's variants: the scalar kernel (rows not a multiple of 8), the transposed codes
  // alone, and the GEMM into an f32 tensor that it accumulates into (the weight gradient).
  c.push_back({"fp8_cast_transpose_variants", 1e-4, [=](Device d) {
                 const Tensor odd = act(d, {37, 40}, 73, -2, 2), x = act(d, {rows, in}, 74, -2, 2);
                 const Tensor s = f32(d, std::vector<float>{50.f}, {1}), one = f32(d, std::vector<float>{1.f}, {1});
                 Tensor q_odd = Tensor::empty({37, 40}, DType::U8, d), qt_odd = Tensor::empty({40, 37}, DType::U8, d);
                 Tensor qt = Tensor::empty({in, rows}, DType::U8, d), none;
                 Tensor amax = Tensor::zeros({1}, DType::F32, d), sat = Tensor::zeros({1}, DType::I64, d);
                 fp8_cast_transpose(odd, s, Fp8Format::E5M2, q_odd, &qt_odd, amax, sat);
                 fp8_cast_transpose(x, s, Fp8Format::E4M3, none, &qt, amax, sat);
                 Tensor qx = Tensor::empty({rows, in}, DType::U8, d);
                 fp8_cast_transpose(x, s, Fp8Format::E4M3, qx, nullptr, amax, sat);
                 Tensor used = Tensor::zeros({1}, DType::F32, d), inv = Tensor::zeros({1}, DType::F32, d);
                 fp8_snapshot_scale(s, used, inv);
                 Tensor amax_vec = Tensor::zeros({1}, DType::F32, d), amax_odd = Tensor::zeros({1}, DType::F32, d);
                 fp8_amax(x, amax_vec);                          // 8-element vectors
                 fp8_amax(act(d, {3, 7}, 76, -5, 5), amax_odd);  // 21 elements: the scalar kernel
                 const float n_sat = static_cast<float>(*sat.to_device(Device::CPU).data<int64_t>());
                 return Outputs{decoded(q_odd, Fp8Format::E5M2), decoded(qt_odd, Fp8Format::E5M2),
                                decoded(qt, Fp8Format::E4M3), decoded(qx, Fp8Format::E4M3), amax, used, inv,
                                amax_vec, amax_odd,
                                Tensor::from_vector(std::vector<float>{n_sat}, {1})};
               }});
  // The weight gradient's GEMM: FP8 codes in, accumulating into an f32 tensor. Products of codes
  // are exact, but the tensor cores add them in their own order and width (Hopper's FP8 MMA keeps
  // fewer accumulator bits than fp32 between promotions), so this compares within 1e-3, not the
  // codes' exactness.
  c.push_back({"fp8_gemm_into_f32", 1e-3, [=](Device d) {
                 const Tensor x = act(d, {rows, in}, 74, -2, 2);
                 const Tensor s = f32(d, std::vector<float>{50.f}, {1}), one = f32(d, std::vector<float>{1.f}, {1});
                 Tensor qt = Tensor::empty({in, rows}, DType::U8, d), none;
                 Tensor amax = Tensor::zeros({1}, DType::F32, d), sat = Tensor::zeros({1}, DType::I64, d);
                 fp8_cast_transpose(x, s, Fp8Format::E4M3, none, &qt, amax, sat);
                 Tensor dw = f32(d, {in, in}, 75);  // += qt qt^T over the rows, f32 in and out
                 fp8_gemm_into(qt, Fp8Format::E4M3, one, qt, Fp8Format::E4M3, one, &dw, dw);
                 return Outputs{dw};
               }});
  // The opt-in casts (model/fp8.h, Fp8Switches): current scaling's cast computing its own scale
  // (the vector kernel and, 37 rows, the three ops it stands for), the transpose of codes (the
  // vector kernel, and an odd shape's scalar one) and SwiGLU backward's amax without its output.
  // Codes and scales exactly (the amax is an input: the same on both devices).
  c.push_back({"fp8_opt_in_casts", 1e-7, [=](Device d) {
                 const Tensor x = act(d, {rows, in}, 77, -3, 3), odd = act(d, {37, 40}, 78, -2, 2);
                 const Tensor ax = f32(d, std::vector<float>{2.5f}, {1}), aodd = f32(d, std::vector<float>{0.f}, {1});
                 auto scalar = [&] { return Tensor::zeros({1}, DType::F32, d); };
                 Tensor sx = scalar(), ux = scalar(), ix = scalar(), so = scalar(), uo = scalar(), io = scalar();
                 Tensor sat = Tensor::zeros({1}, DType::I64, d), none;
                 Tensor qx = Tensor::empty({rows, in}, DType::U8, d), qxt = Tensor::empty({in, rows}, DType::U8, d);
                 Tensor qot = Tensor::empty({40, 37}, DType::U8, d);
                 fp8_cast_transpose_current(x, ax, Fp8Format::E4M3, sx, ux, ix, qx, &qxt, sat);  // 3 > 2.5: clips
                 fp8_cast_transpose_current(odd, aodd, Fp8Format::E5M2, so, uo, io, none, &qot, sat);
                 Tensor tx = Tensor::empty({in, rows}, DType::U8, d), todd = Tensor::empty({37, 40}, DType::U8, d);
                 fp8_transpose_codes(qx, tx);
                 fp8_transpose_codes(qot, todd);
                 const float n_sat = static_cast<float>(*sat.to_device(Device::CPU).data<int64_t>());
                 return Outputs{decoded(qx, Fp8Format::E4M3), decoded(qxt, Fp8Format::E4M3),
                                decoded(qot, Fp8Format::E5M2), sx, ux, ix, so, uo, io,
                                decoded(tx, Fp8Format::E4M3), decoded(todd, Fp8Format::E5M2),
                                Tensor::from_vector(std::vector<float>{n_sat}, {1})};
               }});
  c.push_back({"swiglu_backward_amax", 2e-2, [=](Device d) {  // bf16 against fp32 gradients
                 const Tensor h = act(d, {rows, 256}, 79, -3, 3), dy = act(d, {rows, 128}, 80);
                 Tensor a = Tensor::zeros({1}, DType::F32, d);
                 swiglu_backward_amax(dy, h, a);
                 return Outputs{a};
               }});
  // Greedy decoding's argmax over the real vocabulary (the padded tail holds larger values that
  // must be left out), with ties (the lowest index wins), bf16 rounding (the same values on both
  // devices) and a NaN that must never win.
  c.push_back({"argmax_rows", 0.0, [=](Device d) {
                 std::vector<float> v = test::rounded(test::random_vec<float>(6 * 300, 81, -4, 4));
                 for (int64_t r = 0; r < 6; ++r) v[static_cast<size_t>(r * 300 + 290)] = 100.f;  // padding
                 v[1 * 300 + 17] = v[1 * 300 + 201] = 50.f;                                        // a tie
                 v[2 * 300 + 5] = std::nanf("");
                 v[2 * 300 + 6] = 60.f;
                 const Tensor t = Tensor::from_vector(v, {6, 300});
                 const Tensor l = d == Device::CPU ? t : t.to(DType::BF16).to_device(d);
                 return Outputs{argmax_rows(l, 280)};
               }});
  // The engine's logprobs: log-softmax of the real vocabulary at given ids (the padded tail holds
  // larger values that must be left out).
  c.push_back({"token_logprobs", 1e-5, [=](Device d) {
                 std::vector<float> v = test::rounded(test::random_vec<float>(6 * 300, 82, -4, 4));
                 for (int64_t r = 0; r < 6; ++r) v[static_cast<size_t>(r * 300 + 290)] = 100.f;  // padding
                 const Tensor t = Tensor::from_vector(v, {6, 300});
                 const Tensor l = d == Device::CPU ? t : t.to(DType::BF16).to_device(d);
                 return Outputs{token_logprobs(l, ids(d, {0, 279, 17, 100, 5, 200}), 280)};
               }});
  add_moe_cases(c);
  return c;
}

TEST(GpuBackendOps, EveryOpMatchesTheCpu) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Outputs want = c.run(Device::CPU), got = c.run(Device::CUDA);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const std::vector<float> g = host(got[i]), w = host(want[i]);
      ASSERT_EQ(g.size(), w.size()) << "output " << i;
      if (want[i].dtype() == DType::I32) {  // choices, maps, rows: exactly the CPU's
        ASSERT_EQ(got[i].dtype(), DType::I32) << "output " << i;
        const double e = test::max_abs_diff(g, w);
        std::printf("%-28s output %zu: max |diff| %g\n", c.name.c_str(), i, e);
        EXPECT_EQ(e, 0.0) << "output " << i;
        continue;
      }
      const double e = test::rel_l2(g, w);
      std::printf("%-28s output %zu: rel L2 %.2e\n", c.name.c_str(), i, e);
      EXPECT_LT(e, c.tol) << "output " << i;
    }
  }
}

// The CPU side of the table runs everywhere: each op dispatches to the CPU for CPU tensors.
TEST(BackendOps, EveryOpRunsOnTheCpu) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    for (const Tensor& t : c.run(Device::CPU)) {
      EXPECT_EQ(t.device(), Device::CPU);
      for (float v : host(t)) ASSERT_TRUE(std::isfinite(v));
    }
  }
}

}  // namespace
}  // namespace mt::ops
