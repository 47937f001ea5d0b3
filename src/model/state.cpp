#include "model/state.h"

#include <algorithm>
#include <utility>

#include "deepinfer/error.h"
#include "ops/ops.h"

namespace deepinfer {

PagePool::PagePool(int64_t page_floats, int64_t capacity, Device device)
    : page_floats_(page_floats), capacity_(capacity), device_(device) {
  DI_CHECK(page_floats > 0 && capacity >= 0, "page pool: bad page size {} or capacity {}", page_floats, capacity);
}

float* PagePool::acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!free_.empty()) {
    float* p = free_.back();
    free_.pop_back();
    return p;
  }
  DI_CHECK(static_cast<int64_t>(pages_.size()) < capacity_,
           "state pool exhausted: all {} pages of {} floats are in use (the KV budget accounting let too much in)",
           capacity_, page_floats_);
  pages_.push_back(Tensor::empty({page_floats_}, DType::kF32, device_));
  return pages_.back().data<float>();
}

void PagePool::release(float* page) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(page);
}

int64_t PagePool::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(pages_.size() - free_.size());
}

int64_t PagePool::allocated() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(pages_.size());
}

RowPages::RowPages(int64_t width, std::shared_ptr<PagePool> pool, Device device)
    : width_(width), pool_(std::move(pool)), device_(pool_ ? pool_->device() : device) {
  DI_CHECK(!pool_ || pool_->page_floats() == kRowsPerPage * width_,
           "row pages of width {} from a pool of {}-float pages", width_, pool_ ? pool_->page_floats() : 0);
  DI_CHECK(device_ == device, "row pages on {} from a pool on {}", device_name(device), device_name(device_));
}
RowPages::~RowPages() { clear(); }
RowPages::RowPages(RowPages&& o) noexcept
    : width_(o.width_),
      rows_(o.rows_),
      pool_(std::move(o.pool_)),
      device_(o.device_),
      pages_(std::move(o.pages_)),
      own_(std::move(o.own_)),
      device_pages_(std::move(o.device_pages_)),
      device_synced_(std::exchange(o.device_synced_, 0)) {
  o.rows_ = 0;
  o.pages_.clear();
}
RowPages& RowPages::operator=(RowPages&& o) noexcept {
  if (this != &o) {
    clear();
    width_ = o.width_;
    rows_ = std::exchange(o.rows_, 0);
    pool_ = std::move(o.pool_);
    device_ = o.device_;
    pages_ = std::move(o.pages_);
    own_ = std::move(o.own_);
    device_pages_ = std::move(o.device_pages_);
    device_synced_ = std::exchange(o.device_synced_, 0);
    o.pages_.clear();
  }
  return *this;
}
void RowPages::clear() {
  if (pool_)
    for (float* p : pages_) pool_->release(p);
  pages_.clear();
  own_.clear();
  device_pages_ = Tensor();
  device_synced_ = 0;
  rows_ = 0;
}

float* RowPages::append() {
  if (rows_ % kRowsPerPage == 0) {
    if (pool_) {
      pages_.push_back(pool_->acquire());
    } else {
      own_.push_back(Tensor::empty({kRowsPerPage * width_}, DType::kF32, device_));
      pages_.push_back(own_.back().data<float>());
    }
  }
  return row(rows_++);
}

template <typename RunFn>
void RowPages::append_runs(int64_t n, RunFn&& run) {
  for (int64_t i = 0; i < n;) {
    float* dst = append();  // the first row of a run that stays inside one page
    const int64_t len = std::min(n - i, kRowsPerPage - (rows_ - 1) % kRowsPerPage);
    for (int64_t k = 1; k < len; ++k) append();
    run(dst, i, len);
    i += len;
  }
}

void RowPages::append_rows(const Tensor& src) {
  const int64_t n = src.dim() == 2 ? src.size(0) : 0;
  DI_CHECK(src.dim() == 2 && src.size(1) == width_ && src.dtype() == DType::kF32 && src.is_contiguous(),
           "row pages of width {}: cannot append {}", width_, src.describe());
  const size_t rb = width_ * sizeof(float);
  append_runs(n, [&](float* dst, int64_t i, int64_t len) {
    copy_bytes(dst, device_, src.data<float>() + i * width_, src.device(), len * rb);
  });
}

void RowPages::append_copies(const Tensor& src, std::vector<ops::RowCopy>& out) {
  const int64_t n = src.dim() == 2 ? src.size(0) : 0;
  DI_CHECK(src.dim() == 2 && src.size(1) == width_ && src.dtype() == DType::kF32 && src.is_contiguous() &&
               src.device() == device_,
           "row pages of width {} on {}: cannot append {} by copies", width_, device_name(device_), src.describe());
  append_runs(n, [&](float* dst, int64_t i, int64_t len) {
    out.push_back({dst, src.data<float>() + i * width_, len});
  });
}

void RowPages::copy_to(const Tensor& dst) const {
  DI_CHECK(dst.dim() == 2 && dst.size(0) == rows_ && dst.size(1) == width_ && dst.dtype() == DType::kF32 &&
               dst.is_contiguous(),
           "row pages [{}, {}]: cannot copy into {}", rows_, width_, dst.describe());
  if (dst.device() == device_) {  // one gather for every page (one launch on CUDA)
    std::vector<ops::RowSegment> segs;
    segments(segs);
    ops::gather_segments(segs, dst);
    return;
  }
  for (int64_t r = 0; r < rows_; r += kRowsPerPage)
    copy_bytes(dst.data<float>() + r * width_, dst.device(), row(r), device_,
               std::min(kRowsPerPage, rows_ - r) * width_ * sizeof(float));
}

void RowPages::segments(std::vector<ops::RowSegment>& out) const {
  for (int64_t r = 0; r < rows_; r += kRowsPerPage) out.push_back({row(r), std::min(kRowsPerPage, rows_ - r)});
}

void RowPages::paged_segment(std::vector<ops::RowSegment>& out) const {
  if (rows_ == 0) return;
  ops::RowSegment s{nullptr, rows_};
  s.pages = pages_.data();
  s.page_rows = kRowsPerPage;
  if (device_ == Device::kCUDA) {
    const int64_t n = num_pages();
    if (!device_pages_.defined() || device_pages_.numel() < n) {  // grown: the whole list uploaded again
      int64_t cap = device_pages_.defined() ? device_pages_.numel() : 64;
      while (cap < n) cap *= 2;
      device_pages_ = Tensor::empty({cap}, DType::kI64, device_);
      device_synced_ = 0;
    }
    static_assert(sizeof(float*) == sizeof(int64_t), "page addresses are stored as int64");
    if (device_synced_ < n) {  // queued without a synchronisation (the pageable source is staged at once)
      copy_bytes(device_pages_.data<int64_t>() + device_synced_, device_, pages_.data() + device_synced_, Device::kCPU,
                 static_cast<size_t>(n - device_synced_) * sizeof(float*));
      device_synced_ = n;
    }
    s.device_pages = reinterpret_cast<const uint64_t*>(device_pages_.data<int64_t>());
  }
  out.push_back(s);
}

WindowRing::WindowRing(int64_t window, int64_t width, std::shared_ptr<PagePool> pool, Device device)
    : window_(window), width_(width), pool_(std::move(pool)), device_(pool_ ? pool_->device() : device) {
  DI_CHECK(device_ == device, "window ring on {} from a pool on {}", device_name(device), device_name(device_));
  if (pool_) {
    DI_CHECK(pool_->page_floats() == window * width, "window ring of {}x{} from a pool of {}-float pages", window,
             width, pool_->page_floats());
    data_ = pool_->acquire();
  } else {
    own_ = Tensor::empty({window * width}, DType::kF32, device_);
    data_ = own_.data<float>();
  }
  zero_bytes(data_, device_, window * width * sizeof(float));
}

void WindowRing::segments(int64_t p0, int64_t p1, std::vector<ops::RowSegment>& out) const {
  DI_CHECK(p0 >= 0 && p0 <= p1 && p1 - p0 <= window_, "window ring: cannot read positions [{}, {})", p0, p1);
  for (int64_t p = p0; p < p1;) {
    const int64_t run = std::min(p1 - p, window_ - p % window_);  // up to the ring's end
    out.push_back({slot(p), run});
    p += run;
  }
}

void WindowRing::write_copies(int64_t p0, int64_t p1, const Tensor& src, std::vector<ops::RowCopy>& out) {
  DI_CHECK(p0 >= 0 && p0 <= p1 && p1 - p0 <= window_ && src.dtype() == DType::kF32 && src.is_contiguous() &&
               src.numel() >= (p1 - p0) * width_ && src.device() == device_,
           "window ring: cannot write positions [{}, {}) from {}", p0, p1, src.describe());
  std::vector<ops::RowSegment> runs;  // the slots of [p0, p1), each run then takes the next rows of src
  segments(p0, p1, runs);
  int64_t r = 0;
  for (const ops::RowSegment& run : runs) {
    out.push_back({slot(p0 + r), src.data<float>() + r * width_, run.rows});
    r += run.rows;
  }
}

WindowRing::~WindowRing() { clear(); }
WindowRing::WindowRing(WindowRing&& o) noexcept
    : window_(o.window_),
      width_(o.width_),
      pool_(std::move(o.pool_)),
      device_(o.device_),
      data_(std::exchange(o.data_, nullptr)),
      own_(std::move(o.own_)) {}
WindowRing& WindowRing::operator=(WindowRing&& o) noexcept {
  if (this != &o) {
    clear();
    window_ = o.window_;
    width_ = o.width_;
    pool_ = std::move(o.pool_);
    device_ = o.device_;
    data_ = std::exchange(o.data_, nullptr);
    own_ = std::move(o.own_);
  }
  return *this;
}
void WindowRing::clear() {
  if (pool_ && data_) pool_->release(data_);
  data_ = nullptr;
  own_ = Tensor();
}

SequenceState::SequenceState(const ModelConfig& cfg, const StatePools& pools, Device device) {
  layers.resize(cfg.n_layers);
  if (cfg.family == ModelFamily::kV41) {
    // V4.1: every layer has its window ring; only kv sources hold compressed KV, index keys and
    // (ratio 2) the open pair of the compressor.
    for (int64_t l = 0; l < cfg.n_layers; ++l) {
      LayerState& s = layers[l];
      s.window = WindowRing(cfg.window_size, cfg.head_dim, pools.window, device);
      if (!cfg.is_kv_source(l)) continue;
      s.compressed = RowPages(cfg.head_dim, pools.compressed, device);
      s.index_keys = RowPages(cfg.index_head_dim, pools.index_keys, device);
      if (cfg.compress_ratio(l) > 1) s.compressor.init(cfg.compress_ratio(l), cfg.head_dim, device);
    }
    return;
  }
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    LayerState& s = layers[l];
    s.window = WindowRing(cfg.window_size, cfg.head_dim, pools.window, device);
    const int64_t r = cfg.compress_ratio(l);
    if (r > 0) {
      const int64_t c = r == 4 ? 2 : 1;
      s.compressed = RowPages(cfg.head_dim, pools.compressed, device);
      s.compressor.init(r, c * cfg.head_dim, device);
      if (r == 4) {
        s.index_keys = RowPages(cfg.index_head_dim, pools.index_keys, device);
        s.index_compressor.init(r, c * cfg.index_head_dim, device);
      }
    }
  }
}

}  // namespace deepinfer
