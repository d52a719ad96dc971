#pragma once
// CPU reference of the mixture-of-experts ops (ops.def, "Mixture of experts"), for float (the
// training path) and double (the same code in fp64, for gradient checks). Shapes: logits, probs,
// dprobs [n, E] with n tokens, rows t = s*B + b; selected / map / token_rows int32 [n, E].
#include <cstdint>

#include "kernels/moe_routing.h"

namespace mt::cpu {

template <class T>
void moe_route(const T* logits, const float* expert_bias, const ops::RouterSpec& spec, int64_t n, T* probs,
               int32_t* selected);
template <class T>
void moe_route_backward(const T* logits, const int32_t* selected, const T* dprobs, const ops::RouterSpec& spec,
                        int64_t n, T* dlogits);
template <class T>
void moe_aux_stats(const T* logits, const ops::RouterSpec& spec, int64_t n, int64_t B, T* score_sums, T* counts,
                   T* z_sum);
template <class T>
void moe_aux_backward(const T* logits, const ops::RouterSpec& spec, int64_t n, int64_t B, const T* coef, T z_coef,
                      T* dlogits);
// map [n, E] from probs and selected; zeroes dropped probs.
void moe_capacity(float* probs, const int32_t* selected, int64_t n, int64_t E, int64_t capacity, bool by_position,
                  bool pad_to_capacity, int32_t* map);
// token_rows [n, E] and counts [E] from map.
void moe_dispatch_plan(const int32_t* map, int64_t n, int64_t E, int32_t* token_rows, int32_t* counts);

}  // namespace mt::cpu
