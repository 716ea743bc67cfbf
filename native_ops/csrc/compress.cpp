// Gradient-compression kernels for cann-train (CPU, OpenMP over chunks).
//
// Semantics are pinned by native_ops/reference.py (pure torch); the tests compare the two exactly.
//   * top-k by magnitude: exactly k indices, ties at the k-th magnitude broken by the lower index,
//     indices returned ascending (int32), values cast to fp16 (saturated to +-65504) / bf16 / fp32.
//     The k-th magnitude is found from a sampled threshold estimate (Lin et al. 2018, Deep Gradient
//     Compression, sec. 3 "sampling to reduce top-k selection") followed by an exact selection among
//     the few candidates above it, so the result is exact without sorting the whole gradient.
//   * sign: 1 bit per element (bit j of byte b <-> element 8b+j, bit set <=> x < 0), one fp32 scale
//     per chunk = mean |x| over the chunk, accumulated in double (Bernstein et al. 2018 signSGD;
//     scaled sign as in Karimireddy et al. 2019, EF-SignSGD).
//   * error feedback: residual <- residual + scale*grad - decompress(compress(residual + scale*grad))
//     (Seide et al. 2014 1-bit SGD; Karimireddy et al. 2019).
//
// Ascend C / CUDA versions plug in behind the same Python signatures (see docs/comm.md).

#include <torch/extension.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t kChunk = 1 << 16;  // elements per OpenMP work item (256 KiB of fp32)

inline int num_threads() { return std::max(1, at::get_num_threads()); }

void check_f32_1d(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, " must be float32");
  TORCH_CHECK(t.dim() == 1 && t.is_contiguous(), name, " must be 1-D contiguous");
}

// Deterministic stratified sample positions: one per stride, jittered by a fixed xorshift stream.
inline uint64_t xorshift64(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

// Estimate a magnitude threshold expected to leave about `target` of the n elements of (a + scale*add)
// at or above it, from a deterministic stratified sample (one jittered position per stride).
float sampled_threshold(const float* a, const float* add, float scale, int64_t n, double target) {
  const double density = std::min(1.0, target / static_cast<double>(n));
  int64_t s = static_cast<int64_t>(std::ceil(256.0 / std::max(density, 1e-9)));
  s = std::min<int64_t>(n, std::max<int64_t>(s, 4096));
  std::vector<float> mag(s);
  const double stride = static_cast<double>(n) / static_cast<double>(s);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (int64_t j = 0; j < s; ++j) {
    const int64_t lo = static_cast<int64_t>(j * stride);
    const int64_t hi = std::min<int64_t>(n, static_cast<int64_t>((j + 1) * stride));
    const uint64_t span = static_cast<uint64_t>(std::max<int64_t>(1, hi - lo));
    const int64_t pos = std::min<int64_t>(n - 1, lo + static_cast<int64_t>(xorshift64(state) % span));
    const float v = add != nullptr ? a[pos] + scale * add[pos] : a[pos];
    mag[j] = std::fabs(v);
  }
  const int64_t r = static_cast<int64_t>(std::floor(density * static_cast<double>(s)));
  if (r >= s) return 0.0f;
  std::nth_element(mag.begin(), mag.begin() + r, mag.end(), std::greater<float>());
  return mag[r];
}

// Collect indices with |a[i]| >= thr, in ascending order, one OpenMP work item per chunk.
// If `add` is non-null, first performs a[i] += scale * add[i] (fused error-feedback accumulation).
std::vector<int32_t> collect_candidates(float* a, const float* add, float scale, int64_t n, float thr) {
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
  std::vector<std::vector<int32_t>> per_chunk(nchunks);
#pragma omp parallel for schedule(static) num_threads(num_threads())
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    if (add != nullptr) {
      for (int64_t i = lo; i < hi; ++i) a[i] += scale * add[i];
    }
    int64_t cnt = 0;
    for (int64_t i = lo; i < hi; ++i) cnt += (std::fabs(a[i]) >= thr);
    auto& out = per_chunk[c];
    out.reserve(cnt);
    for (int64_t i = lo; i < hi; ++i) {
      if (std::fabs(a[i]) >= thr) out.push_back(static_cast<int32_t>(i));
    }
  }
  size_t total = 0;
  for (auto& v : per_chunk) total += v.size();
  std::vector<int32_t> cand;
  cand.reserve(total);
  for (auto& v : per_chunk) cand.insert(cand.end(), v.begin(), v.end());
  return cand;
}

// Exact top-k (ties -> lower index) of |a|, ascending indices. Optionally fuses a += scale*add.
torch::Tensor select_topk(float* a, const float* add, float scale, int64_t n, int64_t k) {
  auto opts = torch::TensorOptions().dtype(torch::kInt32);
  if (k >= n || k <= 0) {
    if (add != nullptr) {
#pragma omp parallel for schedule(static) num_threads(num_threads())
      for (int64_t i = 0; i < n; ++i) a[i] += scale * add[i];
    }
    return k <= 0 ? torch::empty({0}, opts) : torch::arange(n, opts);
  }
  // Aim for ~1.25 k candidates; when the sample under-estimates the tail, lower the threshold and rescan
  // (the fused accumulation happens only in the first pass). After 3 misses, take everything.
  std::vector<int32_t> cand;
  double target = 1.25 * static_cast<double>(k);
  for (int attempt = 0;; ++attempt) {
    const float* pass_add = attempt == 0 ? add : nullptr;
    const float thr = attempt < 3 ? sampled_threshold(a, pass_add, scale, n, target) : 0.0f;
    cand = collect_candidates(a, pass_add, scale, n, thr);
    if (static_cast<int64_t>(cand.size()) >= k) break;
    TORCH_CHECK(attempt < 3, "top-k: fewer than k comparable magnitudes (NaN in the gradient?)");
    target *= 4.0;
  }
  // Now the candidates (ascending) contain the top-k. Find the k-th largest magnitude t.
  const int64_t c = static_cast<int64_t>(cand.size());
  std::vector<float> mag(c);
  for (int64_t j = 0; j < c; ++j) mag[j] = std::fabs(a[cand[j]]);
  std::vector<float> tmp(mag);
  std::nth_element(tmp.begin(), tmp.begin() + (k - 1), tmp.end(), std::greater<float>());
  const float t = tmp[k - 1];
  int64_t greater = 0;
  for (int64_t j = 0; j < c; ++j) greater += (mag[j] > t);
  int64_t ties_needed = k - greater;
  torch::Tensor idx = torch::empty({k}, opts);
  int32_t* out = idx.data_ptr<int32_t>();
  int64_t o = 0;
  for (int64_t j = 0; j < c; ++j) {
    if (mag[j] > t) {
      out[o++] = cand[j];
    } else if (mag[j] == t && ties_needed > 0) {
      out[o++] = cand[j];
      --ties_needed;
    }
  }
  TORCH_CHECK(o == k, "top-k selection produced ", o, " of ", k, " indices");
  return idx;
}

template <typename T>
inline T to_value(float v);
template <>
inline float to_value<float>(float v) { return v; }
template <>
inline c10::Half to_value<c10::Half>(float v) {
  return c10::Half(std::min(65504.0f, std::max(-65504.0f, v)));  // saturate instead of inf
}
template <>
inline c10::BFloat16 to_value<c10::BFloat16>(float v) { return c10::BFloat16(v); }

// values[j] = cast(a[idx[j]]); if subtract: a[idx[j]] -= float(values[j]) (error-feedback remainder).
template <typename T>
void gather_values(float* a, const int32_t* idx, T* vals, int64_t k, bool subtract) {
#pragma omp parallel for schedule(static) num_threads(num_threads())
  for (int64_t j = 0; j < k; ++j) {
    const float v = a[idx[j]];
    const T q = to_value<T>(v);
    vals[j] = q;
    if (subtract) a[idx[j]] = v - static_cast<float>(q);
  }
}

torch::Tensor gather_typed(float* a, const torch::Tensor& idx, torch::ScalarType dtype, bool subtract) {
  const int64_t k = idx.numel();
  auto vals = torch::empty({k}, torch::TensorOptions().dtype(dtype));
  const int32_t* ip = idx.data_ptr<int32_t>();
  switch (dtype) {
    case torch::kFloat32:
      gather_values<float>(a, ip, vals.data_ptr<float>(), k, subtract);
      break;
    case torch::kFloat16:
      gather_values<c10::Half>(a, ip, vals.data_ptr<c10::Half>(), k, subtract);
      break;
    case torch::kBFloat16:
      gather_values<c10::BFloat16>(a, ip, vals.data_ptr<c10::BFloat16>(), k, subtract);
      break;
    default:
      TORCH_CHECK(false, "value dtype must be float32, float16 or bfloat16");
  }
  return vals;
}

}  // namespace

// (indices int32[k] ascending, values[k]) of the k largest-magnitude elements of x.
std::vector<torch::Tensor> topk_compress(torch::Tensor x, int64_t k, torch::ScalarType value_dtype) {
  check_f32_1d(x, "x");
  const int64_t n = x.numel();
  k = std::min(std::max<int64_t>(k, 0), n);
  float* a = x.data_ptr<float>();
  auto idx = select_topk(a, nullptr, 0.f, n, k);
  auto vals = gather_typed(a, idx, value_dtype, /*subtract=*/false);
  return {idx, vals};
}

// Fused error feedback: residual += scale*grad; (idx, vals) = topk(residual); residual[idx] -= vals.
std::vector<torch::Tensor> topk_ef_compress(torch::Tensor grad, torch::Tensor residual, int64_t k,
                                            torch::ScalarType value_dtype, double scale) {
  check_f32_1d(grad, "grad");
  check_f32_1d(residual, "residual");
  TORCH_CHECK(grad.numel() == residual.numel(), "grad and residual sizes differ");
  const int64_t n = grad.numel();
  k = std::min(std::max<int64_t>(k, 0), n);
  float* r = residual.data_ptr<float>();
  auto idx = select_topk(r, grad.data_ptr<float>(), static_cast<float>(scale), n, k);
  auto vals = gather_typed(r, idx, value_dtype, /*subtract=*/true);
  return {idx, vals};
}

// out[idx[w, j]] += alpha * float(vals[w, j]) for w = 0..W-1 in order (rows of a 2-D stack, or one row).
void topk_decompress_add(torch::Tensor out, torch::Tensor idx, torch::Tensor vals, double alpha) {
  check_f32_1d(out, "out");
  TORCH_CHECK(idx.scalar_type() == torch::kInt32, "indices must be int32");
  TORCH_CHECK(idx.sizes() == vals.sizes(), "indices and values shapes differ");
  auto idx2 = idx.contiguous().reshape({-1, idx.size(-1)});
  auto val2 = vals.to(torch::kFloat32).contiguous().reshape({-1, idx.size(-1)});
  const int64_t rows = idx2.size(0), k = idx2.size(1), n = out.numel();
  float* o = out.data_ptr<float>();
  const float al = static_cast<float>(alpha);
  for (int64_t w = 0; w < rows; ++w) {  // rows in order: deterministic sum; within a row indices are unique
    const int32_t* ip = idx2.data_ptr<int32_t>() + w * k;
    const float* vp = val2.data_ptr<float>() + w * k;
    bool bad = false;
#pragma omp parallel for schedule(static) num_threads(num_threads()) reduction(|| : bad)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = ip[j];
      if (i < 0 || i >= n) {
        bad = true;
        continue;
      }
      o[i] += al * vp[j];
    }
    TORCH_CHECK(!bad, "top-k index out of range");
  }
}

namespace {

// Sign-compress one chunk of acc into bits/scale; if residual mode, acc[i] -= decompressed.
inline void sign_chunk(float* a, const float* add, float scale, int64_t lo, int64_t hi, uint8_t* bits,
                       float* out_scale, bool ef) {
  double sum = 0.0;
  if (add != nullptr) {
    for (int64_t i = lo; i < hi; ++i) a[i] += scale * add[i];
  }
  for (int64_t i = lo; i < hi; ++i) sum += static_cast<double>(std::fabs(a[i]));
  const float s = static_cast<float>(sum / static_cast<double>(hi - lo));
  *out_scale = s;
  // lo is a multiple of 8 (chunk sizes are), so bytes never straddle chunks.
  for (int64_t b = lo / 8; b < (hi + 7) / 8; ++b) {
    uint8_t byte = 0;
    const int64_t base = b * 8;
    for (int j = 0; j < 8 && base + j < hi; ++j) byte |= static_cast<uint8_t>(a[base + j] < 0.0f) << j;
    bits[b] = byte;
  }
  if (ef) {
    for (int64_t i = lo; i < hi; ++i) a[i] -= (a[i] < 0.0f) ? -s : s;
  }
}

std::vector<torch::Tensor> sign_impl(torch::Tensor target, const float* add, float scale, int64_t chunk,
                                     bool ef) {
  TORCH_CHECK(chunk > 0 && chunk % 8 == 0, "chunk must be a positive multiple of 8");
  const int64_t n = target.numel();
  const int64_t nchunks = (n + chunk - 1) / chunk;
  auto bits = torch::empty({(n + 7) / 8}, torch::TensorOptions().dtype(torch::kUInt8));
  auto scales = torch::empty({nchunks}, torch::TensorOptions().dtype(torch::kFloat32));
  float* a = target.data_ptr<float>();
  uint8_t* bp = bits.data_ptr<uint8_t>();
  float* sp = scales.data_ptr<float>();
#pragma omp parallel for schedule(static) num_threads(num_threads())
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t lo = c * chunk, hi = std::min(n, lo + chunk);
    sign_chunk(a, add, scale, lo, hi, bp, sp + c, ef);
  }
  return {bits, scales};
}

}  // namespace

// (bits uint8[ceil(n/8)], scales fp32[ceil(n/chunk)]) of x; x is not modified.
std::vector<torch::Tensor> sign_compress(torch::Tensor x, int64_t chunk) {
  check_f32_1d(x, "x");
  // sign_impl never writes `a` when ef=false and add=nullptr.
  return sign_impl(x, nullptr, 0.f, chunk, /*ef=*/false);
}

// Fused error feedback: residual += scale*grad; compress(residual); residual -= decompressed.
std::vector<torch::Tensor> sign_ef_compress(torch::Tensor grad, torch::Tensor residual, int64_t chunk,
                                            double scale) {
  check_f32_1d(grad, "grad");
  check_f32_1d(residual, "residual");
  TORCH_CHECK(grad.numel() == residual.numel(), "grad and residual sizes differ");
  return sign_impl(residual, grad.data_ptr<float>(), static_cast<float>(scale), chunk, /*ef=*/true);
}

// out += alpha * sum_w decompress(bits[w], scales[w]) (rows in order), one OpenMP item per chunk.
void sign_decompress_add(torch::Tensor out, torch::Tensor bits, torch::Tensor scales, int64_t chunk,
                         double alpha) {
  check_f32_1d(out, "out");
  TORCH_CHECK(chunk > 0 && chunk % 8 == 0, "chunk must be a positive multiple of 8");
  TORCH_CHECK(bits.scalar_type() == torch::kUInt8 && scales.scalar_type() == torch::kFloat32,
              "bits must be uint8 and scales float32");
  const int64_t n = out.numel();
  const int64_t nbytes = (n + 7) / 8, nchunks = (n + chunk - 1) / chunk;
  auto b2 = bits.contiguous().reshape({-1, nbytes});
  auto s2 = scales.contiguous().reshape({-1, nchunks});
  TORCH_CHECK(b2.size(0) == s2.size(0), "bits and scales disagree on the number of rows");
  const int64_t rows = b2.size(0);
  float* o = out.data_ptr<float>();
  const uint8_t* bp = b2.data_ptr<uint8_t>();
  const float* sp = s2.data_ptr<float>();
  const float al = static_cast<float>(alpha);
#pragma omp parallel for schedule(static) num_threads(num_threads())
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t lo = c * chunk, hi = std::min(n, lo + chunk);
    for (int64_t w = 0; w < rows; ++w) {
      const float s = al * sp[w * nchunks + c];
      const uint8_t* rb = bp + w * nbytes;
      for (int64_t i = lo; i < hi; ++i) {
        const bool neg = (rb[i >> 3] >> (i & 7)) & 1;
        o[i] += neg ? -s : s;
      }
    }
  }
}

// residual += scale*grad - decompressed (dense error feedback for any compressor).
void ef_update(torch::Tensor residual, torch::Tensor grad, torch::Tensor decompressed, double scale) {
  check_f32_1d(residual, "residual");
  check_f32_1d(grad, "grad");
  check_f32_1d(decompressed, "decompressed");
  TORCH_CHECK(residual.numel() == grad.numel() && grad.numel() == decompressed.numel(), "sizes differ");
  const int64_t n = residual.numel();
  float* r = residual.data_ptr<float>();
  const float* g = grad.data_ptr<float>();
  const float* d = decompressed.data_ptr<float>();
  const float sc = static_cast<float>(scale);
#pragma omp parallel for schedule(static) num_threads(num_threads())
  for (int64_t i = 0; i < n; ++i) r[i] = (r[i] + sc * g[i]) - d[i];
}

int64_t openmp_max_threads() { return omp_get_max_threads(); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "cann-train gradient-compression kernels (CPU, OpenMP)";
  m.def("topk_compress", &topk_compress, "exact top-k by magnitude with sampled threshold");
  m.def("topk_ef_compress", &topk_ef_compress, "fused error feedback + top-k");
  m.def("topk_decompress_add", &topk_decompress_add, "scatter-add of (indices, values) rows");
  m.def("sign_compress", &sign_compress, "1-bit sign + per-chunk mean-|x| scale");
  m.def("sign_ef_compress", &sign_ef_compress, "fused error feedback + sign compression");
  m.def("sign_decompress_add", &sign_decompress_add, "accumulate decompressed sign rows");
  m.def("ef_update", &ef_update, "residual += scale*grad - decompressed");
  m.def("openmp_max_threads", &openmp_max_threads, "omp_get_max_threads()");
}
