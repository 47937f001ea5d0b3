// The three linear contracts of docs/v4-architecture.md §2.1 and the attention output projection,
// shared by the sublayers of both families.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "core/debug_dump.h"
#include "deepinfer/error.h"
#include "model/layers_v4.h"

namespace deepinfer {

ops::LinearOpts linear_q_opts(const LayerCtx& c) { return {c.num.simulate_qat ? c.cfg.fp8_block : 0, c.num.bf16}; }
Tensor linear_q(const Tensor& x, const ops::QWeight& w, const LayerCtx& c) {
  return ops::linear(x, w, linear_q_opts(c));
}
Tensor linear_bf16(const Tensor& x, const ops::QWeight& w, const LayerCtx& c) {
  return ops::linear(x, w, {0, c.num.bf16});
}
Tensor linear_f32(const Tensor& x, const ops::QWeight& w) { return ops::linear(x, w, {0, false}); }

std::pair<Tensor, Tensor> linear_q_pair(const Tensor& x, const ops::QWeight& a, const ops::QWeight& b,
                                        const ops::QWeight& stacked, const LayerCtx& c) {
  if (!stacked.w.defined()) return {linear_q(x, a, c), linear_q(x, b, c)};
  const Tensor y = linear_q(x, stacked, c);
  return {y.slice(1, 0, a.out()), y.slice(1, a.out(), y.size(1))};
}

Tensor indexer_head_weights(const Tensor& x, const ops::QWeight& proj, const LayerCtx& c) {
  const int64_t nh = c.cfg.index_n_heads, hd = c.cfg.index_head_dim;
  Tensor w = linear_bf16(x, proj, c);
  ops::scale(w, static_cast<float>(std::pow(static_cast<double>(hd), -0.5) * std::pow(static_cast<double>(nh), -0.5)),
             c.num.bf16);
  return w;
}

namespace {

// DEEPINFER_CUDA_WHOLE_TABLES=1: CUDA gathers every row of a layer's state into one table per step for the attention
// and the indexers, as before the rows were read in place (gather_listed, index_scores_segments): an A/B switch.
bool whole_tables() {
  static const bool on = env_int("DEEPINFER_CUDA_WHOLE_TABLES", 0) != 0;
  return on;
}

}  // namespace

Tensor index_scores_pages(const Tensor& q, const RowPages& keys, const Tensor& w, const ops::KeyVisibility& vis,
                          bool round) {
  std::vector<ops::RowSegment> segs;
  keys.paged_segment(segs);
  return ops::index_scores_segments(q, segs, w, vis, round, !whole_tables());
}

Tensor index_scores_jobs(const std::vector<IndexJob>& jobs, const Tensor& iq, const Tensor& iw, int64_t nh, int64_t hd,
                         bool round) {
  DI_CHECK(!jobs.empty(), "index_scores_jobs: no jobs");
  const int64_t lo = jobs.front().row0, hi = jobs.back().row0 + jobs.back().T, R = hi - lo;
  int64_t N = 0, W = 0, prev = lo;
  std::vector<ops::RowSegment> segs;
  for (const IndexJob& j : jobs) {
    DI_CHECK(j.row0 >= prev && j.T >= 0 && j.ratio > 0 && j.keys != nullptr && j.keys->width() == hd,
             "index_scores_jobs: job rows [{}, {}) after row {}, ratio {}", j.row0, j.row0 + j.T, prev, j.ratio);
    prev = j.row0 + j.T;
    j.keys->paged_segment(segs);
    N += j.keys->rows();
    W = std::max(W, j.keys->rows());
  }
  DI_CHECK(N < (int64_t{1} << 31), "index_scores_jobs: {} index keys in one batch", N);
  const Device dev = iq.device();
  Tensor meta = Tensor::zeros({2 * R}, DType::kI32);  // visible counts [R], then first keys [R]
  int32_t* counts = meta.data<int32_t>();
  int32_t* offsets = counts + R;
  int64_t off = 0;
  for (const IndexJob& j : jobs) {
    const int64_t n = j.keys->rows();
    for (int64_t t = 0; t < j.T; ++t) {
      counts[j.row0 - lo + t] = static_cast<int32_t>(std::min(n, (j.start_pos + t + 1) / j.ratio));
      offsets[j.row0 - lo + t] = static_cast<int32_t>(off);
    }
    off += n;
  }
  meta = meta.to(dev);
  ops::KeyVisibility vis;
  vis.counts = meta.slice(0, 0, R);
  vis.offsets = meta.slice(0, R, 2 * R);
  vis.width = W;
  // The keys in their pages (ops::index_scores_segments): read in place (on the CPU a table copied every key of the
  // batch at every step: ~0.95 ms of a 16k-token decode step of mini-v41).
  return ops::index_scores_segments(iq.slice(0, lo, hi).view({R, nh, hd}), segs, iw.slice(0, lo, hi), vis, round,
                                    !whole_tables());
}

Tensor attend_chunks(const Tensor& q, std::vector<AttnChunk>& chunks, const Tensor& sink, const int64_t* positions,
                     const ops::RopeFreqs& rope, const LayerCtx& c, const Tensor& out) {
  const ModelConfig& cfg = c.cfg;
  const int64_t H = cfg.n_heads, D = cfg.head_dim, W = cfg.window_size;
  const bool bf = c.num.bf16;
  auto table_rows = [](const AttnChunk& k) {
    return k.start_pos + k.kv.size(0) - k.wstart + (k.compressed ? k.compressed->rows() : 0);
  };
  int64_t rows = 0, n = 0, width = 0;
  for (const AttnChunk& k : chunks) {
    rows += k.kv.size(0);
    n += table_rows(k);
    width = std::max(width, k.lay.wcols + k.lay.kcols);
  }
  DI_CHECK(rows == q.size(0), "attention: {} chunk rows for {} query rows", rows, q.size(0));
  const Device dev = q.device();
  if (rows == 0) return Tensor::empty({0, H * D}, DType::kF32, dev);
  // On the CPU the attention reads the rings, the new rows and the compressed pages where they are
  // (ops::sparse_attention_segments): gathering them into one table copied every row of the layer's state at every step
  // (a quarter of a 16k-token decode step of mini-v41 went to these copies). CUDA gathers (its kernels read one table);
  // so does a debug dump (the table is one of its files).
  const bool in_place = dev == Device::kCPU && !dump_enabled();
  // CUDA gathers the rows the lists name (ops::gather_listed: at most window + index_topk a query row, however long the
  // context) where they are fewer than the table's (a decode step past a short context), else the whole table
  // (prefill, where the rows share it); a debug dump keeps the whole table (one of its files).
  const bool listed = !in_place && !dump_enabled() && !whole_tables() && rows * width < n;
  Tensor table = in_place ? Tensor() : Tensor::empty({listed ? rows * width : n, D}, DType::kF32, dev);
  Tensor idx = Tensor::empty({rows, width}, DType::kI32, dev);
  // Every chunk's table part (its window rows [wstart, start_pos) from the ring, its own rows, its compressed entries)
  // as runs of rows, gathered by one ops::gather_segments: a decode batch's table took 3-4 copies per chunk and layer.
  // The state lives on the model's device, as the rows do (SequenceState is made there).
  std::vector<ops::RowSegment> segs;
  std::vector<ops::IndexChunk> lists;  // every chunk's index lists, built in one call
  int64_t base = 0;
  for (AttnChunk& k : chunks) {
    const int64_t T = k.kv.size(0), tn = table_rows(k);
    DI_CHECK(k.kv.is_contiguous() && k.ring->device() == dev && (!k.compressed || k.compressed->device() == dev),
             "attention: the window KV {} and the sequence's state must be contiguous rows on {}", k.kv.describe(),
             device_name(dev));
    k.ring->segments(k.wstart, k.start_pos, segs);
    segs.push_back({k.kv.data<float>(), T});
    if (k.compressed) k.compressed->paged_segment(segs);  // one entry, not a run per page (ops::RowSegment)
    ops::IndexLayout lay = k.lay;
    lay.base = base;
    lay.width = width;
    lists.push_back({lay, T, k.picks});
    base += tn;
  }
  ops::sparse_index_many(lists, dev, idx);  // written in place: no copy
  // Slide each window ring forward over its chunk, once its rows are in the table or, read in place, once the attention
  // has read them (a chunk's new rows overwrite ring slots its first rows still attend): one copy_rows for the batch.
  // (Not in the gather's launch: measured on the H200, the attention that follows ran 3-6 us longer per layer.)
  auto slide_rings = [&] {
    std::vector<ops::RowCopy> writes;
    for (AttnChunk& k : chunks) {
      const int64_t T = k.kv.size(0), p0 = std::max(k.start_pos, k.start_pos + T - W);
      k.ring->write_copies(p0, k.start_pos + T, k.kv.slice(0, p0 - k.start_pos, T), writes);
    }
    ops::copy_rows(writes, D, dev);
  };
  if (!in_place) {
    if (listed)
      ops::gather_listed(segs, idx, table);  // idx rewritten to the gathered rows
    else
      ops::gather_segments(segs, table);
    slide_rings();
  }
  if (dump_enabled()) {
    dump("table", c.layer, table);
    const Tensor host = idx.to(Device::kCPU);
    Tensor fi = Tensor::empty(idx.shape(), DType::kF32);
    for (int64_t i = 0; i < idx.numel(); ++i) fi.data<float>()[i] = static_cast<float>(host.data<int32_t>()[i]);
    dump("idx", c.layer, fi);
  }
  const ops::AttnDerotate derotate{positions, &rope, cfg.rope_head_dim};
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const ops::AttnDerotate* derot = cfg.rope_head_dim > 0 ? &derotate : nullptr;
  Tensor o;
  if (in_place) {
    o = ops::sparse_attention_segments(q.view({rows, H, D}), segs, idx, sink, scale, bf, bf, derot);
    slide_rings();
  } else {
    o = ops::sparse_attention(q.view({rows, H, D}), table, idx, sink, scale, bf, bf, derot,
                              out.defined() && out.numel() == rows * H * D && out.device() == dev ? out : Tensor());
  }
  o = o.view({rows, H * D});
  dump("o_derot", c.layer, o);
  return o;
}

namespace {

// wo_a's group of each of n rows (row i: group i mod G) as int32 on `device`, uploaded once per (n, G, device) and
// kept: a decode step's output projection reads the same list every step (and a CUDA graph's replay reads this very
// tensor, so it must not be uploaded inside the captured piece).
const Tensor& group_rows(int64_t n, int64_t G, Device device) {
  static std::mutex mu;
  static std::map<std::tuple<int64_t, int64_t, Device>, Tensor>* cache =
      new std::map<std::tuple<int64_t, int64_t, Device>, Tensor>();  // never destroyed: freed blocks at exit
  std::lock_guard<std::mutex> lock(mu);
  Tensor& t = (*cache)[{n, G, device}];
  if (!t.defined()) {
    std::vector<int64_t> group_of(n);
    for (int64_t i = 0; i < n; ++i) group_of[i] = i % G;
    t = ids_tensor(group_of, device);
  }
  return t;
}

// wo_a on the exact linear: o [T, H*D] through its G block-diagonal groups, z [T, G*R].
Tensor wo_a_exact(const Tensor& o, const ops::QWeight& wo_a, const LayerCtx& c) {
  const ModelConfig& cfg = c.cfg;
  const int64_t T = o.size(0), G = cfg.o_groups, gin = cfg.n_heads * cfg.head_dim / G, R = cfg.o_lora_rank;
  const bool bf = c.num.bf16;
  std::vector<ops::QWeight> parts(G, wo_a);
  for (int64_t g = 0; g < G; ++g) {
    parts[g].w = wo_a.w.slice(0, g * R, (g + 1) * R);
    if (wo_a.scale.defined()) parts[g].scale = wo_a.scale.slice(0, g * R / wo_a.block, (g + 1) * R / wo_a.block);
  }
  if (run_grouped(T * G, o.device())) {
    // o [T, H*D] is [T*G, gin] row by row: row (t, g) through group g gives z[t, g*R:(g+1)*R] in place.
    return ops::linear_grouped(o.view({T * G, gin}), group_rows(T * G, G, o.device()), parts, {0, bf}, 0, G)
        .view({T, G * R});
  }
  Tensor z = Tensor::empty({T, G * R}, DType::kF32, o.device());
  for (int64_t g = 0; g < G; ++g)
    copy_tensor(z.view({T, G, R}).select(1, g),
                linear_bf16(o.view({T, G, gin}).select(1, g).contiguous(), parts[g], c));
  return z;
}

}  // namespace

Tensor attention_output(const Tensor& o, const ops::QWeight& wo_a, const ops::QWeight& wo_b, const LayerCtx& c) {
  // wo_a is block-diagonal over groups: group g projects only its own heads' outputs. Under the tensor-core contract
  // one launch over the groups (ops::linear_groups_tc); else the exact linear, in one launch where a kernel takes the
  // block-diagonal form (ops::linear_groups_exact), else per group.
  Tensor z = ops::linear_groups_tc(o, wo_a, c.cfg.o_groups, {0, c.num.bf16});
  if (!z.defined()) z = ops::linear_groups_exact(o, wo_a, c.cfg.o_groups, {0, c.num.bf16});
  if (!z.defined()) z = wo_a_exact(o, wo_a, c);
  dump("z", c.layer, z);
  return linear_q(z, wo_b, c);
}

}  // namespace deepinfer
