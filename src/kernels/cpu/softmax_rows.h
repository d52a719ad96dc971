#pragma once
// Per-row softmax pieces for the fused output head (output_loss.cpp), in float on the widest x86
// vector unit present, with the same bits on every one (softmax_rows.cpp says how).
#include <cstdint>

namespace mt::cpu {

struct ExpSum {
  double max;  // the row's max (-inf for an empty row), exact
  double sum;  // sum of the exp values, in vec::sum_lanes's order
};

// row[j] = exp(row[j] - max) for j < n (vec::exp_vec's polynomial); returns the max and the sum.
ExpSum exp_sum_row(float* row, int64_t n);
ExpSum exp_sum_row(double* row, int64_t n);

// row[j] *= f for j < n.
void scale_row(float* row, int64_t n, float f);
void scale_row(double* row, int64_t n, double f);

// d[k] += s[k] for k < n.
void add_row(float* d, const float* s, int64_t n);
void add_row(double* d, const double* s, int64_t n);

}  // namespace mt::cpu
