#pragma once
// The shape of one attention call, shared by the CPU and CUDA kernels and the model: q
// [B, Hq, S, D], k/v [B, Hkv, Sk, D] (Hq = Hkv * group: GQA; Sk = S unless set), the score scale,
// causal masking and attention dropout (p > 0: the normalised probabilities are dropped with
// Philox keyed by (seed, offset, (b*Hq+h)*T*T + P*T + Pk), P and Pk the query's and key's
// positions and T the whole sequence's length, regenerated identically in backward).
//
// Two generalisations, both off by default:
//  * Chunks (context parallelism): q holds positions [q_pos, q_pos + S) of a sequence of
//    seq_total tokens and k/v positions [k_pos, k_pos + Sk); causal masking compares positions,
//    so one call is the attention of one chunk of queries against one chunk of keys.
//  * Packed documents (--reset-attention-mask): cu_seqlens (num_segments + 1 ascending I32
//    entries, the first 0 and the last B * seq_total) cut the batch's B * seq_total positions,
//    sample after sample, into documents that never attend across their borders; every sample
//    border is also a document border. The kernels find a row's document by binary search, so
//    no mask is ever stored. On the CPU it is a host pointer, on the GPU a device pointer.
#include <cstdint>

// visible_keys runs in the CUDA kernels too.
#ifdef __CUDACC__
#define MT_HOST_DEVICE __host__ __device__
#else
#define MT_HOST_DEVICE
#endif

namespace mt::ops {

struct AttentionShape {
  int64_t B, Hq, Hkv, S, D;
  float scale;  // usually 1/sqrt(D)
  bool causal = true;
  float dropout_p = 0.f;
  uint64_t seed = 0, offset = 0;
  int64_t Sk = 0;                       // keys per head; 0: S
  int64_t q_pos = 0, k_pos = 0;         // positions of the first query and key rows
  int64_t seq_total = 0;                // the whole sequence's length; 0: S
  const int32_t* cu_seqlens = nullptr;  // packed documents (see above); null: one per sample
  int64_t num_segments = 0;
  // The same cu_seqlens on the host, where the caller has them (the model's SequenceLayout
  // does): the GPU's cuDNN path for packed documents sizes its graph from the document count
  // and the longest document without a device-to-host copy. Null: that path is not taken.
  const int32_t* cu_seqlens_host = nullptr;

  MT_HOST_DEVICE int64_t keys() const { return Sk > 0 ? Sk : S; }
  MT_HOST_DEVICE int64_t total() const { return seq_total > 0 ? seq_total : S; }
  // True where the call is the plain self-attention of a whole sequence: what every kernel
  // serves. The chunk and document forms run on the CPU kernels and the GPU's generic ones.
  bool plain() const { return keys() == S && q_pos == 0 && k_pos == 0 && total() == S && cu_seqlens == nullptr; }
};

// The keys [lo, hi) (chunk-local key indices, clamped to [0, keys())) that query row i
// (chunk-local) of sample b sees. Host or device code alike (a plain inline function).
struct KeyRange {
  int64_t lo, hi;
};
inline MT_HOST_DEVICE KeyRange visible_keys(const AttentionShape& p, int64_t b, int64_t i) {
  const int64_t T = p.total(), P = p.q_pos + i;
  int64_t lo = 0, hi = p.causal ? P + 1 : T;
  if (p.cu_seqlens) {
    // The document holding flat position b*T + P: the last boundary <= it.
    const int64_t g = b * T + P;
    int64_t a = 0, z = p.num_segments;  // invariant: cu[a] <= g < cu[z]
    while (z - a > 1) {
      const int64_t m = (a + z) / 2;
      if (p.cu_seqlens[m] <= g) a = m;
      else z = m;
    }
    const int64_t ds = p.cu_seqlens[a] - b * T, de = p.cu_seqlens[a + 1] - b * T;
    lo = ds > lo ? ds : lo;
    hi = de < hi ? de : hi;
  }
  const int64_t n = p.keys();
  lo -= p.k_pos;
  hi -= p.k_pos;
  lo = lo < 0 ? 0 : (lo > n ? n : lo);
  hi = hi < 0 ? 0 : (hi > n ? n : hi);
  return {lo, hi > lo ? hi : lo};
}

}  // namespace mt::ops
