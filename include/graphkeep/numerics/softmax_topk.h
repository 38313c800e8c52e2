// graphkeep/numerics/softmax_topk.h: softmax routing of a Mixtral / Qwen3-MoE
// router in scalar code that a CUDA kernel and its CPU twin share, so both
// compute bit for bit the same function (kernels/cuda/moe_grouped.cu and
// kernels/moe_experts.cpp, gk::kernels::SwigluExperts).
//
//   fexp(x)            e^x from fadd/fmul/rint and exponent bits only (no libm,
//                      no __expf, which differ by an ulp): within 2 ulp;
//   fsilu(x)           x / (1 + fexp(-x)), ATen's CPU formula for silu;
//   softmax_row        p = fexp(l - max) * (1 / sum);
//   torch_topk_order   the indices torch.topk(p, k) returns on the CPU, in its
//                      order, ties included (Note [torch.topk's order of ties]).
//
// No Torch, no Boost: .cu files include this header (C++17 there).
#pragma once

#include <graphkeep/numerics/exact_math.h>

#include <cstdint>

namespace gk::numerics {

GK_HD float round_to_int(float a) {  // ties to even (the default rounding mode on both sides)
#if defined(__CUDA_ARCH__)
  return rintf(a);
#else
  return __builtin_rintf(a);
#endif
}

// 2^k as a float, for k in [-126, 127].
GK_HD float pow2i(int k) { return float_of(static_cast<std::uint32_t>(k + 127) << 23); }

// e^x: x = n ln2 + r (Cody-Waite, ln2 split in a 15-bit head, so n * head is
// exact, and a tail), |r| <= ln2/2; e^r by its Taylor polynomial of degree 7
// (truncation error < 1e-8 relative) in Horner form; times 2^n in two exact
// halves, so that results in the subnormal range round once. Measured against
// a double-precision exp over [-104, 88.7]: at most 2 ulp
// (tests/sites_moe_test.cpp).
GK_HD float fexp(float x) {
  if (x != x) return x;
  if (x > 88.8f) return float_of(0x7F800000u);  // e^88.73 already overflows
  if (x < -104.f) return 0.f;                  // below half the smallest subnormal
  const float n = round_to_int(fmul(x, 1.44269502162933349609375f));  // log2(e) in float
  float r = fsub(x, fmul(n, 0.693145751953125f));                      // ln2 head (0x3F317200)
  r = fsub(r, fmul(n, 1.428606765330187045e-06f));                    // ln2 tail
  float p = 1.f / 5040.f;
  p = fadd(fmul(p, r), 1.f / 720.f);
  p = fadd(fmul(p, r), 1.f / 120.f);
  p = fadd(fmul(p, r), 1.f / 24.f);
  p = fadd(fmul(p, r), 1.f / 6.f);
  p = fadd(fmul(p, r), 0.5f);
  p = fadd(fmul(p, r), 1.f);
  p = fadd(fmul(p, r), 1.f);
  const int ni = static_cast<int>(n);  // in [-150, 128]
  const int n1 = ni / 2, n2 = ni - n1;
  return fmul(fmul(p, pow2i(n1)), pow2i(n2));
}

// silu(x) = x * sigmoid(x), as ATen's CPU kernel writes it: x / (1 + e^-x).
GK_HD float fsilu(float x) { return fdiv(x, fadd(1.f, fexp(fsub(0.f, x)))); }

// p[e] = softmax(l)[e] over n values: the max, e^(l - max), their sum in index
// order, then each times 1 / sum. ATen's softmax may differ by an ulp (another
// exp, sums in vector lanes): equal logits give equal p on both sides, so
// ties survive; only logits within an ulp or so of each other can compare
// differently.
GK_HD void softmax_row(const float* l, std::int64_t n, float* p) {
  float m = l[0];
  for (std::int64_t e = 1; e < n; ++e) m = l[e] > m ? l[e] : m;
  float sum = 0.f;
  for (std::int64_t e = 0; e < n; ++e) {
    p[e] = fexp(fsub(l[e], m));
    sum = fadd(sum, p[e]);
  }
  const float inv = fdiv(1.f, sum);
  for (std::int64_t e = 0; e < n; ++e) p[e] = fmul(p[e], inv);
}

// Note [torch.topk's order of ties]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// torch.topk on the CPU (ATen's topk_impl_loop, aten/src/ATen/native/TopKImpl.h)
// fills (value, index) pairs in index order and, with comp(a, b) = "a is NaN
// and b is not, or a > b":
//   k * 64 <= n: std::partial_sort(q, q + k, q + n, comp)
//   otherwise:   std::nth_element(q, q + k - 1, q + n, comp), then
//                std::sort(q, q + k - 1, comp)
// and returns the first k pairs. Neither algorithm is stable, so equal values
// come out in an order that only libstdc++'s code determines (lower index
// first is wrong for about half of the tied 8-expert cases). The functions
// below are libstdc++'s (GCC 12's bits/stl_algo.h and bits/stl_heap.h)
// transcribed on an array of indices compared by their values, the
// recursion of __introsort_loop replaced by a stack (its ranges are disjoint,
// so the order in which they are processed changes nothing). The test
// compares the result with at::topk, ties included, for n up to 160 and k up
// to 20, both branches (tests/sites_moe_test.cpp). CUDA's torch.topk orders
// ties otherwise: an engine compared on the GPU may differ on exact ties.
namespace topk_detail {

struct Greater {
  const float* v;
  GK_HD bool operator()(std::int32_t a, std::int32_t b) const {
    const float x = v[a], y = v[b];
    return (x != x && y == y) || x > y;
  }
};

GK_HD void swap_at(std::int32_t* a, std::int32_t* b) {
  const std::int32_t t = *a;
  *a = *b;
  *b = t;
}

GK_HD std::int64_t lg(std::int64_t n) {  // std::__lg: floor(log2(n)), n > 0
  std::int64_t k = 0;
  while (n >>= 1) ++k;
  return k;
}

GK_HD void move_median_to_first(std::int32_t* result, std::int32_t* a, std::int32_t* b, std::int32_t* c,
                                Greater comp) {
  if (comp(*a, *b)) {
    if (comp(*b, *c))
      swap_at(result, b);
    else if (comp(*a, *c))
      swap_at(result, c);
    else
      swap_at(result, a);
  } else if (comp(*a, *c)) {
    swap_at(result, a);
  } else if (comp(*b, *c)) {
    swap_at(result, c);
  } else {
    swap_at(result, b);
  }
}

GK_HD std::int32_t* unguarded_partition(std::int32_t* first, std::int32_t* last, const std::int32_t* pivot,
                                        Greater comp) {
  while (true) {
    while (comp(*first, *pivot)) ++first;
    --last;
    while (comp(*pivot, *last)) --last;
    if (!(first < last)) return first;
    swap_at(first, last);
    ++first;
  }
}

GK_HD std::int32_t* unguarded_partition_pivot(std::int32_t* first, std::int32_t* last, Greater comp) {
  std::int32_t* mid = first + (last - first) / 2;
  move_median_to_first(first, first + 1, mid, last - 1, comp);
  return unguarded_partition(first + 1, last, first, comp);
}

GK_HD void unguarded_linear_insert(std::int32_t* last, Greater comp) {
  const std::int32_t val = *last;
  std::int32_t* next = last - 1;
  while (comp(val, *next)) {
    *last = *next;
    last = next;
    --next;
  }
  *last = val;
}

GK_HD void insertion_sort(std::int32_t* first, std::int32_t* last, Greater comp) {
  if (first == last) return;
  for (std::int32_t* i = first + 1; i != last; ++i) {
    if (comp(*i, *first)) {
      const std::int32_t val = *i;
      for (std::int32_t* p = i; p != first; --p) *p = *(p - 1);
      *first = val;
    } else {
      unguarded_linear_insert(i, comp);
    }
  }
}

GK_HD void push_heap(std::int32_t* first, std::int64_t hole, std::int64_t top, std::int32_t value, Greater comp) {
  std::int64_t parent = (hole - 1) / 2;
  while (hole > top && comp(first[parent], value)) {
    first[hole] = first[parent];
    hole = parent;
    parent = (hole - 1) / 2;
  }
  first[hole] = value;
}

GK_HD void adjust_heap(std::int32_t* first, std::int64_t hole, std::int64_t len, std::int32_t value, Greater comp) {
  const std::int64_t top = hole;
  std::int64_t second = hole;
  while (second < (len - 1) / 2) {
    second = 2 * (second + 1);
    if (comp(first[second], first[second - 1])) second--;
    first[hole] = first[second];
    hole = second;
  }
  if ((len & 1) == 0 && second == (len - 2) / 2) {
    second = 2 * (second + 1);
    first[hole] = first[second - 1];
    hole = second - 1;
  }
  push_heap(first, hole, top, value, comp);
}

GK_HD void make_heap(std::int32_t* first, std::int32_t* last, Greater comp) {
  const std::int64_t len = last - first;
  if (len < 2) return;
  std::int64_t parent = (len - 2) / 2;
  while (true) {
    adjust_heap(first, parent, len, first[parent], comp);
    if (parent == 0) return;
    parent--;
  }
}

GK_HD void pop_heap(std::int32_t* first, std::int32_t* last, std::int32_t* result, Greater comp) {
  const std::int32_t value = *result;
  *result = *first;
  adjust_heap(first, 0, last - first, value, comp);
}

GK_HD void heap_select(std::int32_t* first, std::int32_t* middle, std::int32_t* last, Greater comp) {
  make_heap(first, middle, comp);
  for (std::int32_t* i = middle; i < last; ++i)
    if (comp(*i, *first)) pop_heap(first, middle, i, comp);
}

GK_HD void sort_heap(std::int32_t* first, std::int32_t* last, Greater comp) {
  while (last - first > 1) {
    --last;
    pop_heap(first, last, last, comp);
  }
}

GK_HD void introselect(std::int32_t* first, std::int32_t* nth, std::int32_t* last, std::int64_t depth, Greater comp) {
  while (last - first > 3) {
    if (depth == 0) {
      heap_select(first, nth + 1, last, comp);
      swap_at(first, nth);
      return;
    }
    --depth;
    std::int32_t* cut = unguarded_partition_pivot(first, last, comp);
    if (cut <= nth)
      first = cut;
    else
      last = cut;
  }
  insertion_sort(first, last, comp);
}

constexpr std::int64_t kSortThreshold = 16;  // libstdc++'s _S_threshold

GK_HD void sort(std::int32_t* first, std::int32_t* last, Greater comp) {
  if (first == last) return;
  struct Range {
    std::int32_t* first;
    std::int32_t* last;
    std::int64_t depth;
  };
  // __introsort_loop; the depths on the stack strictly decrease, so it never
  // holds more than 2 * lg(n) + 1 <= 64 ranges.
  Range stack[64];
  int top = 0;
  stack[top++] = {first, last, lg(last - first) * 2};
  while (top > 0) {
    Range r = stack[--top];
    while (r.last - r.first > kSortThreshold) {
      if (r.depth == 0) {  // __partial_sort(first, last, last)
        heap_select(r.first, r.last, r.last, comp);
        sort_heap(r.first, r.last, comp);
        break;
      }
      --r.depth;
      std::int32_t* cut = unguarded_partition_pivot(r.first, r.last, comp);
      stack[top++] = {cut, r.last, r.depth};
      r.last = cut;
    }
  }
  // __final_insertion_sort
  if (last - first > kSortThreshold) {
    insertion_sort(first, first + kSortThreshold, comp);
    for (std::int32_t* i = first + kSortThreshold; i != last; ++i) unguarded_linear_insert(i, comp);
  } else {
    insertion_sort(first, last, comp);
  }
}

}  // namespace topk_detail

// The indices of torch.topk(v[0..n), k) on the CPU, in its order: q[0..k).
// q is scratch of n entries (the whole working array); 1 <= k <= n.
GK_HD void torch_topk_order(const float* v, std::int64_t n, std::int64_t k, std::int32_t* q) {
  using namespace topk_detail;
  const Greater comp{v};
  for (std::int64_t j = 0; j < n; ++j) q[j] = static_cast<std::int32_t>(j);
  if (k * 64 <= n) {  // std::partial_sort
    heap_select(q, q + k, q + n, comp);
    sort_heap(q, q + k, comp);
  } else {  // std::nth_element, then std::sort of the first k - 1
    introselect(q, q + k - 1, q + n, lg(n) * 2, comp);
    sort(q, q + k - 1, comp);
  }
}

}  // namespace gk::numerics
