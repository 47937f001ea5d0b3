// CPU kernels of the model-level ops (issue 8): indexer scores, MoE routing, clamped SwiGLU, the
// embedding gather and the row gather. Each replays the FP32 operation order of the host loops it
// replaced in src/model, so results are bit-identical to them. moe_group / moe_combine: the MoE
// dispatch and FP32 combine (grouping by expert, accumulation in ascending expert order);
// compress_pool: the compressors' gated pooling; renorm_heads: V4's per-head q re-norm.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/cpu_ops.h"
#include "deepinfer/dtype.h"
#include "deepinfer/error.h"

namespace deepinfer::cpu {

namespace {

std::string desc(const Tensor& t) { return t.defined() ? t.describe() : std::string("undefined"); }

void check_cpu_f32(const Tensor& t, const char* op, const char* name) {
  DI_CHECK(t.defined() && t.device() == Device::kCPU && t.dtype() == DType::kF32 && t.is_contiguous(),
           "{}: {} must be a contiguous float32 CPU tensor, got {}", op, name, desc(t));
}

void check_ids(const Tensor& t, int64_t n, const char* op, const char* name) {
  DI_CHECK(t.defined() && t.device() == Device::kCPU && t.dtype() == DType::kI32 && t.dim() == 1 && t.is_contiguous() &&
               t.size(0) == n,
           "{}: {} must be int32 [{}] on the CPU, got {}", op, name, n, desc(t));
}

// 8 fp32 lanes (one AVX register with -march=x86-64-v3). Lane-wise a + b * c is a product rounded to
// fp32 then a sum rounded to fp32 (the build has -ffp-contract=off): the scalar loop's operations.
typedef float v8f __attribute__((vector_size(32)));
inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }

constexpr int64_t kHeadBlock = 16;  // heads per register block (two v8f)
constexpr int64_t kKeyBlock = 4;    // keys sharing each load of q
constexpr int64_t kKeysPerItem = 64;

// dots[jj * nh + h] = sum_i q[h, i] * key_jj[i], i ascending from 0.0f, for the keys j0..j0+nj (key j at keys[j]).
// qT is q transposed to [d][nh] so that consecutive heads are consecutive lanes.
void head_dots(const float* qT, const float* q, const float* const* keys, int64_t nh, int64_t d, int64_t j0, int64_t nj,
               float* dots) {
  if (nj == kKeyBlock && nh % kHeadBlock == 0) {
    const float* k0 = keys[j0 + 0];
    const float* k1 = keys[j0 + 1];
    const float* k2 = keys[j0 + 2];
    const float* k3 = keys[j0 + 3];
    for (int64_t h0 = 0; h0 < nh; h0 += kHeadBlock) {
      v8f a0 = {}, b0 = {}, a1 = {}, b1 = {}, a2 = {}, b2 = {}, a3 = {}, b3 = {};
      for (int64_t i = 0; i < d; ++i) {
        const v8f qa = load8(qT + i * nh + h0), qb = load8(qT + i * nh + h0 + 8);
        const float c0 = k0[i], c1 = k1[i], c2 = k2[i], c3 = k3[i];
        a0 = a0 + qa * c0;
        b0 = b0 + qb * c0;
        a1 = a1 + qa * c1;
        b1 = b1 + qb * c1;
        a2 = a2 + qa * c2;
        b2 = b2 + qb * c2;
        a3 = a3 + qa * c3;
        b3 = b3 + qb * c3;
      }
      store8(dots + 0 * nh + h0, a0);
      store8(dots + 0 * nh + h0 + 8, b0);
      store8(dots + 1 * nh + h0, a1);
      store8(dots + 1 * nh + h0 + 8, b1);
      store8(dots + 2 * nh + h0, a2);
      store8(dots + 2 * nh + h0 + 8, b2);
      store8(dots + 3 * nh + h0, a3);
      store8(dots + 3 * nh + h0 + 8, b3);
    }
    return;
  }
  for (int64_t jj = 0; jj < nj; ++jj) {
    const float* key = keys[j0 + jj];
    for (int64_t h = 0; h < nh; ++h) {
      const float* qh = q + h * d;
      float dot = 0.0f;
      for (int64_t i = 0; i < d; ++i) dot += qh[i] * key[i];
      dots[jj * nh + h] = dot;
    }
  }
}

inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace

Tensor index_scores(const Tensor& q, const Tensor& keys, const Tensor& w, const KeyVisibility& vis, bool round) {
  check_cpu_f32(keys, "index_scores", "keys");
  DI_CHECK(keys.dim() == 2, "index_scores: expected keys [N, d], got {}", keys.describe());
  const int64_t N = keys.size(0), d = keys.size(1);
  std::vector<const float*> rows(static_cast<size_t>(N));
  for (int64_t j = 0; j < N; ++j) rows[j] = keys.data<float>() + j * d;
  return index_scores_rows(q, rows.data(), N, d, w, vis, round);
}

Tensor index_scores_rows(const Tensor& q, const float* const* rows, int64_t n_rows, int64_t d, const Tensor& w,
                         const KeyVisibility& vis, bool round) {
  check_cpu_f32(q, "index_scores", "q");
  check_cpu_f32(w, "index_scores", "w");
  DI_CHECK(w.dim() == 2 && q.dim() >= 2 && n_rows >= 0 && d >= 0,
           "index_scores: expected keys [{}, {}], w [T, heads], got w {}", n_rows, d, w.describe());
  const int64_t T = q.size(0), N = n_rows, nh = w.size(1);
  DI_CHECK(w.size(0) == T && q.numel() == T * nh * d, "index_scores: q {} does not match w {} and keys of width {}",
           q.describe(), w.describe(), d);
  DI_CHECK(vis.counts.defined() || vis.ratio > 0, "index_scores: ratio {} must be positive", vis.ratio);
  if (vis.counts.defined()) check_ids(vis.counts, T, "index_scores", "counts");
  const bool offs = vis.offsets.defined();
  if (offs) {
    check_ids(vis.offsets, T, "index_scores", "offsets");
    DI_CHECK(vis.counts.defined() && vis.width >= 0, "index_scores: offsets need counts and a width >= 0 (got {})",
             vis.width);
  }
  const int64_t W = offs ? vis.width : N;  // the result's columns
  std::vector<int64_t> visible(T), first_key(T, 0);
  for (int64_t t = 0; t < T; ++t) {
    if (offs) first_key[t] = std::clamp<int64_t>(vis.offsets.data<int32_t>()[t], 0, N);
    visible[t] =
        std::clamp<int64_t>(vis.counts.defined() ? vis.counts.data<int32_t>()[t] : (vis.start_pos + t + 1) / vis.ratio,
                            0, std::min(N - first_key[t], W));
  }

  Tensor out = Tensor::empty({T, W}, DType::kF32);
  float* op = out.data<float>();
  const float* qp = q.data<float>();
  const float* wp = w.data<float>();
  // q of every row transposed to [d][nh].
  std::vector<float> qT(static_cast<size_t>(T * nh * d));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t i = 0; i < d; ++i) qT[(t * d + i) * nh + h] = qp[(t * nh + h) * d + i];
  // Work items: (row, 64-key slice of its visible keys).
  std::vector<int64_t> first(T + 1, 0);
  for (int64_t t = 0; t < T; ++t) first[t + 1] = first[t] + (visible[t] + kKeysPerItem - 1) / kKeysPerItem;
  const int64_t items = first[T];
  auto rd = [round](float v) { return round ? deepinfer::round_bf16(v) : v; };
#pragma omp parallel for schedule(dynamic, 1) if (items > 1)
  for (int64_t it = 0; it < items; ++it) {
    const int64_t t = std::upper_bound(first.begin(), first.end(), it) - first.begin() - 1;
    const int64_t jbeg = (it - first[t]) * kKeysPerItem, jend = std::min(visible[t], jbeg + kKeysPerItem);
    const float* qt = qp + t * nh * d;
    const float* wt = wp + t * nh;
    std::vector<float> dots(static_cast<size_t>(kKeyBlock * nh));
    for (int64_t j0 = jbeg; j0 < jend; j0 += kKeyBlock) {
      const int64_t nj = std::min(kKeyBlock, jend - j0);
      head_dots(qT.data() + t * d * nh, qt, rows + first_key[t], nh, d, j0, nj, dots.data());
      for (int64_t jj = 0; jj < nj; ++jj) {
        double total = 0;
        for (int64_t h = 0; h < nh; ++h) {
          const float dot = rd(dots[jj * nh + h]);
          if (dot > 0) total += rd(dot * wt[h]);
        }
        op[t * W + j0 + jj] = rd(static_cast<float>(total));
      }
    }
  }
  for (int64_t t = 0; t < T; ++t) std::fill(op + t * W + visible[t], op + (t + 1) * W, -INFINITY);
  return out;
}

Routing moe_route(const Tensor& logits, const Tensor& bias, const Tensor& tid2eid, const Tensor& tokens, int64_t k,
                  const RouteOpts& o) {
  check_cpu_f32(logits, "moe_route", "logits");
  DI_CHECK(logits.dim() == 2, "moe_route: logits must be [T, E], got {}", logits.describe());
  const int64_t T = logits.size(0), E = logits.size(1);
  const bool hash = tid2eid.defined();
  DI_CHECK(k >= 1 && k <= E, "moe_route: k = {} for {} experts", k, E);
  if (bias.defined()) {
    check_cpu_f32(bias, "moe_route", "bias");
    DI_CHECK(bias.numel() == E, "moe_route: bias {} for {} experts", bias.describe(), E);
  }
  if (hash) {
    DI_CHECK(tid2eid.device() == Device::kCPU && tid2eid.is_contiguous() && tid2eid.dim() == 2 &&
                 tid2eid.size(1) == k && (tid2eid.dtype() == DType::kI32 || tid2eid.dtype() == DType::kI64),
             "moe_route: tid2eid must be int32/int64 [vocab, {}] on the CPU, got {}", k, tid2eid.describe());
    check_ids(tokens, T, "moe_route", "tokens");
  }
  Routing r{Tensor::empty({T, k}, DType::kI32), Tensor::empty({T, k}, DType::kF32)};
  const float* lp = logits.data<float>();
  int32_t* ip = r.ids.data<int32_t>();
  float* wp = r.weights.data<float>();
  std::vector<float> s(E), biased(E);
  for (int64_t t = 0; t < T; ++t) {
    const float* lr = lp + t * E;
    switch (o.func) {
      case ops::ScoreFunc::kSqrtSoftplus:
        for (int64_t e = 0; e < E; ++e) s[e] = std::sqrt(softplus(o.temp != 1.0f ? lr[e] / o.temp : lr[e]));
        break;
      case ops::ScoreFunc::kSigmoid:
        for (int64_t e = 0; e < E; ++e) {
          const float l = o.temp != 1.0f ? lr[e] / o.temp : lr[e];
          s[e] = 1.0f / (1.0f + std::exp(-l));
        }
        break;
      case ops::ScoreFunc::kSoftmax: {
        float m = -INFINITY, sum = 0.0f;
        for (int64_t e = 0; e < E; ++e) m = std::max(m, s[e] = o.temp != 1.0f ? lr[e] / o.temp : lr[e]);
        for (int64_t e = 0; e < E; ++e) sum += (s[e] = std::exp(s[e] - m));
        for (int64_t e = 0; e < E; ++e) s[e] = s[e] / sum;
        break;
      }
    }
    int32_t* ti = ip + t * k;
    if (hash) {
      const int64_t tok = tokens.data<int32_t>()[t];
      DI_CHECK(tok >= 0 && tok < tid2eid.size(0), "moe_route: token id {} outside the hash table of {} rows", tok,
               tid2eid.size(0));
      for (int64_t j = 0; j < k; ++j) {
        const int64_t at = tok * k + j;
        const int64_t id = tid2eid.dtype() == DType::kI64 ? tid2eid.data<int64_t>()[at] : tid2eid.data<int32_t>()[at];
        DI_CHECK(id >= 0 && id < E, "moe_route: hash table entry {} outside the {} experts", id, E);
        ti[j] = static_cast<int32_t>(id);
      }
    } else {
      for (int64_t e = 0; e < E; ++e) biased[e] = bias.defined() ? s[e] + bias.data<float>()[e] : s[e];
      const int64_t m = topk(biased.data(), E, k, ti);
      DI_CHECK(m == k, "moe_route: only {} of {} experts selectable in row {} (scores -inf or NaN)", m, k, t);
    }
    float* tw = wp + t * k;
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += (tw[j] = s[ti[j]]);
    const float denom = sum + o.norm_eps;
    for (int64_t j = 0; j < k; ++j) {
      if (o.normalize) tw[j] /= denom;
      tw[j] *= o.route_scale;
    }
  }
  return r;
}

Tensor swiglu(const Tensor& g, const Tensor& u, const Tensor& weights, float limit, bool round) {
  check_cpu_f32(g, "swiglu", "g");
  check_cpu_f32(u, "swiglu", "u");
  DI_CHECK(g.dim() == 2 && g.shape() == u.shape(), "swiglu: g {} and u {} must be the same [T, I]", g.describe(),
           u.describe());
  const int64_t T = g.size(0), I = g.size(1);
  if (weights.defined()) {
    check_cpu_f32(weights, "swiglu", "weights");
    DI_CHECK(weights.numel() == T, "swiglu: weights {} for {} rows", weights.describe(), T);
  }
  Tensor h = Tensor::empty({T, I}, DType::kF32);
  const float* gp = g.data<float>();
  const float* up = u.data<float>();
  const float* wp = weights.defined() ? weights.data<float>() : nullptr;
  float* hp = h.data<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < I; ++i) {
      float gv = gp[t * I + i], uv = up[t * I + i];
      if (limit > 0) {
        uv = std::min(std::max(uv, -limit), limit);
        gv = std::min(gv, limit);
      }
      float v = silu(gv) * uv;
      if (wp) v = wp[t] * v;
      hp[t * I + i] = round ? deepinfer::round_bf16(v) : v;
    }
  return h;
}

Tensor embedding(const Tensor& table, const Tensor& ids, int64_t copies) {
  DI_CHECK(table.defined() && table.device() == Device::kCPU && table.is_contiguous() && table.dim() == 2 &&
               (table.dtype() == DType::kBF16 || table.dtype() == DType::kF32),
           "embedding: table must be a contiguous BF16/F32 [V, dim] CPU tensor, got {}", desc(table));
  DI_CHECK(copies >= 1, "embedding: copies = {}", copies);
  DI_CHECK(ids.defined() && ids.dim() == 1, "embedding: ids must be int32 [T], got {}", desc(ids));
  const int64_t T = ids.size(0), V = table.size(0), dim = table.size(1);
  check_ids(ids, T, "embedding", "ids");
  Tensor out = Tensor::empty({T, copies, dim}, DType::kF32);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t row = ids.data<int32_t>()[t];
    DI_CHECK(row >= 0 && row < V, "embedding: id {} outside the table of {} rows", row, V);
    float* dst = out.data<float>() + t * copies * dim;
    if (table.dtype() == DType::kBF16) {
      const uint16_t* src = table.data<uint16_t>() + row * dim;
      for (int64_t d = 0; d < dim; ++d) dst[d] = bf16_to_f32(src[d]);
    } else {
      std::memcpy(dst, table.data<float>() + row * dim, dim * sizeof(float));
    }
    for (int64_t j = 1; j < copies; ++j) std::memcpy(dst + j * dim, dst, dim * sizeof(float));
  }
  return out;
}

Tensor gather_rows(const Tensor& x, const Tensor& rows) {
  check_cpu_f32(x, "gather_rows", "x");
  DI_CHECK(x.dim() >= 1 && rows.defined() && rows.dim() == 1,
           "gather_rows: expected x [N, ...] and rows [R], got {}, {}", x.describe(), desc(rows));
  const int64_t R = rows.size(0), N = x.size(0), width = N == 0 ? 0 : x.numel() / N;
  check_ids(rows, R, "gather_rows", "rows");
  Shape shape = x.shape();
  shape[0] = R;
  Tensor out = Tensor::empty(shape, DType::kF32);
  for (int64_t i = 0; i < R; ++i) {
    const int64_t r = rows.data<int32_t>()[i];
    DI_CHECK(r >= 0 && r < N, "gather_rows: row {} outside [0, {})", r, N);
    std::memcpy(out.data<float>() + i * width, x.data<float>() + r * width, width * sizeof(float));
  }
  return out;
}

MoeGroups moe_group(const Tensor& ids, const Tensor& weights, int64_t n_experts) {
  DI_CHECK(ids.defined() && ids.device() == Device::kCPU && ids.dtype() == DType::kI32 && ids.dim() == 2 &&
               ids.is_contiguous(),
           "moe_group: ids must be int32 [T, k] on the CPU, got {}", desc(ids));
  check_cpu_f32(weights, "moe_group", "weights");
  DI_CHECK(weights.shape() == ids.shape(), "moe_group: weights {} for ids {}", weights.describe(), ids.describe());
  DI_CHECK(n_experts >= 1, "moe_group: {} experts", n_experts);
  const int64_t T = ids.size(0), k = ids.size(1), P = T * k;
  const int32_t* ip = ids.data<int32_t>();
  MoeGroups g;
  g.offsets.assign(n_experts + 1, 0);
  for (int64_t i = 0; i < P; ++i) {
    DI_CHECK(ip[i] >= 0 && ip[i] < n_experts, "moe_group: expert id {} outside [0, {})", ip[i], n_experts);
    ++g.offsets[ip[i] + 1];
  }
  for (int64_t e = 0; e < n_experts; ++e) g.offsets[e + 1] += g.offsets[e];
  g.rows = Tensor::empty({P}, DType::kI32);
  g.weights = Tensor::empty({P}, DType::kF32);
  g.slots = Tensor::empty({T, k}, DType::kI32);
  g.row_expert = Tensor::empty({P}, DType::kI32);
  std::vector<int64_t> next(g.offsets.begin(), g.offsets.end() - 1);
  for (int64_t i = 0; i < P; ++i) {  // (t, j) ascending: each expert's pairs by token, then slot
    const int64_t pos = next[ip[i]]++;
    g.rows.data<int32_t>()[pos] = static_cast<int32_t>(i / k);
    g.row_expert.data<int32_t>()[pos] = ip[i];
    g.weights.data<float>()[pos] = weights.data<float>()[i];
    g.slots.data<int32_t>()[i] = static_cast<int32_t>(pos);
  }
  return g;
}

Tensor moe_combine(const Tensor& expert_out, const Tensor& slots, const Tensor& shared, bool round) {
  check_cpu_f32(expert_out, "moe_combine", "expert_out");
  check_cpu_f32(shared, "moe_combine", "shared");
  DI_CHECK(slots.defined() && slots.device() == Device::kCPU && slots.dtype() == DType::kI32 && slots.dim() == 2 &&
               slots.is_contiguous(),
           "moe_combine: slots must be int32 [T, k] on the CPU, got {}", desc(slots));
  DI_CHECK(shared.dim() == 2 && shared.size(0) == slots.size(0) && expert_out.dim() == 2 &&
               expert_out.size(1) == shared.size(1),
           "moe_combine: expert_out {}, slots {}, shared {} do not match", expert_out.describe(), slots.describe(),
           shared.describe());
  const int64_t T = shared.size(0), dim = shared.size(1), k = slots.size(1), R = expert_out.size(0);
  Tensor out = Tensor::empty({T, dim}, DType::kF32);
  const float* y = expert_out.data<float>();
  std::vector<int32_t> s(k);
  std::vector<float> acc(dim);
  for (int64_t t = 0; t < T; ++t) {
    int64_t n = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t v = slots.data<int32_t>()[t * k + j];
      if (v < 0) continue;
      DI_CHECK(v < R, "moe_combine: slot {} outside the {} expert rows", v, R);
      s[n++] = v;
    }
    std::sort(s.begin(), s.begin() + n);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      const float* yr = y + static_cast<int64_t>(s[i]) * dim;
      for (int64_t d = 0; d < dim; ++d) acc[d] += yr[d];
    }
    const float* sh = shared.data<float>() + t * dim;
    float* o = out.data<float>() + t * dim;
    for (int64_t d = 0; d < dim; ++d) {
      const float v = acc[d] + sh[d];
      o[d] = round ? deepinfer::round_bf16(v) : v;
    }
  }
  return out;
}

void copy_into(const Tensor& dst, const Tensor& src) {
  DI_CHECK(dst.defined() && src.defined() && dst.device() == Device::kCPU && src.device() == Device::kCPU &&
               dst.is_contiguous() && src.is_contiguous() && dst.shape() == src.shape() && dst.dtype() == src.dtype(),
           "copy_into: dst {} and src {} must be contiguous CPU tensors of one shape and dtype", desc(dst), desc(src));
  if (src.nbytes() > 0) std::memcpy(dst.raw(), src.raw(), src.nbytes());
}

void scale(Tensor& x, float s, bool round) {
  check_cpu_f32(x, "scale", "x");
  float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) p[i] = round ? deepinfer::round_bf16(p[i] * s) : p[i] * s;
}

Tensor compress_pool(const Tensor& kv, const Tensor& score, const Tensor& ape, int64_t ratio, int64_t d, bool overlap,
                     bool has_prev) {
  check_cpu_f32(kv, "compress_pool", "kv");
  check_cpu_f32(score, "compress_pool", "score");
  const int64_t r = ratio, lead = overlap ? r : 0;
  DI_CHECK(kv.dim() == 2 && score.shape() == kv.shape() && r >= 1 && d >= 1 && kv.size(1) == (overlap ? 2 * d : d) &&
               kv.size(0) >= lead && (kv.size(0) - lead) % r == 0,
           "compress_pool: kv {} / score {} are not [lead + G*{}, {}]", kv.describe(), score.describe(), r,
           overlap ? 2 * d : d);
  const int64_t w = kv.size(1), G = (kv.size(0) - lead) / r;
  if (ape.defined()) {
    check_cpu_f32(ape, "compress_pool", "ape");
    DI_CHECK(ape.numel() == r * w, "compress_pool: ape {} for [{}, {}]", ape.describe(), r, w);
  }
  const float* kp = kv.data<float>();
  const float* sp = score.data<float>();
  const float* ap = ape.defined() ? ape.data<float>() : nullptr;
  auto sc_at = [&](int64_t row, int64_t col) {
    return ap ? sp[row * w + col] + ap[(row % r) * w + col] : sp[row * w + col];
  };
  Tensor out = Tensor::empty({G, d}, DType::kF32);
  std::vector<float> sc(2 * r), kvv(2 * r);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t base = lead + g * r;  // this group's first row
    for (int64_t ch = 0; ch < d; ++ch) {
      int64_t n = 0;
      if (overlap) {
        const bool prev = g > 0 || has_prev;
        for (int64_t i = 0; i < r; ++i, ++n) {
          kvv[n] = prev ? kp[(base - r + i) * w + ch] : 0.0f;
          sc[n] = prev ? sc_at(base - r + i, ch) : -INFINITY;
        }
        for (int64_t i = 0; i < r; ++i, ++n) {
          kvv[n] = kp[(base + i) * w + d + ch];
          sc[n] = sc_at(base + i, d + ch);
        }
      } else {
        for (int64_t i = 0; i < r; ++i, ++n) {
          kvv[n] = kp[(base + i) * w + ch];
          sc[n] = sc_at(base + i, ch);
        }
      }
      float m = -INFINITY;
      for (int64_t i = 0; i < n; ++i) m = std::max(m, sc[i]);
      float sum = 0.0f;
      for (int64_t i = 0; i < n; ++i) sum += (sc[i] = std::exp(sc[i] - m));
      float acc = 0.0f;
      for (int64_t i = 0; i < n; ++i) acc += kvv[i] * (sc[i] / sum);
      out.data<float>()[g * d + ch] = acc;
    }
  }
  return out;
}

void renorm_heads(Tensor& q, int64_t head_dim, float eps, bool round) {
  check_cpu_f32(q, "renorm_heads", "q");
  DI_CHECK(head_dim >= 1 && q.numel() % head_dim == 0, "renorm_heads: {} is not whole heads of {}", q.describe(),
           head_dim);
  const int64_t n = q.numel() / head_dim;
  float* p = q.data<float>();
  auto rd = [&](float v) { return round ? deepinfer::round_bf16(v) : v; };
#pragma omp parallel for if (n > 16)
  for (int64_t h = 0; h < n; ++h) {
    float* a = p + h * head_dim;
    double ss = 0;
    for (int64_t i = 0; i < head_dim; ++i) ss += rd(a[i] * a[i]);
    const float mean = rd(static_cast<float>(ss / head_dim));
    const float r = rd(1.0f / std::sqrt(rd(mean + eps)));
    for (int64_t i = 0; i < head_dim; ++i) a[i] = rd(a[i] * r);
  }
}

Tensor candidate_blocks(const Tensor& scores, int64_t start_pos, int64_t ratio, int64_t block_size, int64_t keep) {
  check_cpu_f32(scores, "candidate_blocks", "scores");
  DI_CHECK(scores.dim() == 2 && ratio >= 1 && block_size >= 1 && keep >= 0,
           "candidate_blocks: scores {} (want [T, n]), ratio {}, block_size {}, keep {}", scores.describe(), ratio,
           block_size, keep);
  const int64_t T = scores.size(0), n = scores.size(1), bs = block_size, nb = (n + bs - 1) / bs;
  const int64_t kk = std::min(keep, nb);
  Tensor out = Tensor::empty({T, keep}, DType::kI32);
  const float* sp = scores.data<float>();
  int32_t* op = out.data<int32_t>();
#pragma omp parallel for schedule(dynamic, 1) if (T > 1)
  for (int64_t t = 0; t < T; ++t) {
    const float* score = sp + t * n;
    const int64_t visible = std::min(n, (start_pos + t + 1) / ratio);
    std::vector<float> block(nb, -INFINITY);
    for (int64_t j = 0; j < n; ++j) block[j / bs] = std::max(block[j / bs], score[j]);
    if (visible > 0) block[(visible - 1) / bs] = INFINITY;
    int32_t* o = op + t * keep;
    const int64_t m = topk(block.data(), nb, kk, o);
    std::sort(o, o + m);
    std::fill(o + m, o + keep, -1);
  }
  return out;
}

void mask_to_blocks(Tensor& scores, const Tensor& blocks, int64_t block_size) {
  check_cpu_f32(scores, "mask_to_blocks", "scores");
  DI_CHECK(scores.dim() == 2 && blocks.defined() && blocks.device() == Device::kCPU && blocks.dtype() == DType::kI32 &&
               blocks.dim() == 2 && blocks.is_contiguous() && blocks.size(0) == scores.size(0) && block_size >= 1,
           "mask_to_blocks: scores {} and blocks {} (want int32 [T, keep] on the CPU), block_size {}",
           scores.describe(), desc(blocks), block_size);
  const int64_t T = scores.size(0), n = scores.size(1), keep = blocks.size(1), bs = block_size, nb = (n + bs - 1) / bs;
  float* sp = scores.data<float>();
  const int32_t* bp = blocks.data<int32_t>();
#pragma omp parallel for schedule(dynamic, 1) if (T > 1)
  for (int64_t t = 0; t < T; ++t) {
    std::vector<uint8_t> kept(nb, 0);
    for (int64_t i = 0; i < keep; ++i) {
      const int32_t b = bp[t * keep + i];
      if (b >= 0 && b < nb) kept[b] = 1;
    }
    float* score = sp + t * n;
    for (int64_t j = 0; j < n; ++j)
      if (!kept[j / bs]) score[j] = -INFINITY;
  }
}

Tensor sparse_index(const ops::IndexLayout& l, int64_t T, const Tensor& picks, const Tensor& into) {
  DI_CHECK(!picks.defined() || (picks.device() == Device::kCPU && picks.dtype() == DType::kI32 && picks.dim() == 2 &&
                                picks.size(0) == T && picks.size(1) == l.kcols && picks.is_contiguous()),
           "sparse_index: picks {} are not contiguous int32 [{}, {}] on the CPU", desc(picks), T, l.kcols);
  const int64_t width = l.width > 0 ? l.width : l.wcols + l.kcols;
  Tensor out = into.defined() ? into : Tensor::empty({T, width}, DType::kI32);  // into: checked by ops::sparse_index
  int32_t* op = out.data<int32_t>();
  const int32_t* pk = picks.defined() ? picks.data<int32_t>() : nullptr;
  for (int64_t t = 0; t < T; ++t) {
    int32_t* row = op + t * width;
    for (int64_t c = l.wcols + l.kcols; c < width; ++c) row[c] = -1;
    const int64_t p = l.start_pos + t, lo = std::max<int64_t>({0, p - l.window + 1, l.floor});
    const int64_t count = std::max<int64_t>(0, p - lo + 1);
    int64_t c = 0;
    if (l.pad_front)
      while (c < l.wcols - count) row[c++] = -1;
    for (int64_t s = lo; s <= p; ++s) row[c++] = static_cast<int32_t>(s - l.wstart + l.base);
    while (c < l.wcols) row[c++] = -1;
    const int64_t visible = l.ratio > 0 ? (p + 1) / l.ratio : 0;
    for (int64_t i = 0; i < l.kcols; ++i) {
      const int64_t j = pk ? pk[t * l.kcols + i] : (i < visible ? i : -1);
      row[l.wcols + i] = j < 0 ? -1 : static_cast<int32_t>(l.offset + j + l.base);
    }
  }
  return out;
}

}  // namespace deepinfer::cpu
