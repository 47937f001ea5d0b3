// safetensors reader. Format: an 8-byte little-endian header length N, N bytes of JSON
// ({"__metadata__": {str: str}, "<tensor>": {"dtype", "shape", "data_offsets": [begin, end]}}),
// then the data section; offsets are relative to the start of the data section.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "deepinfer/error.h"

namespace deepinfer {

namespace {

using json = nlohmann::json;

// No real header comes near this; a larger value means a corrupt or foreign file.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
// Guards numel/byte arithmetic against overflow from hostile shapes.
constexpr int64_t kMaxNumel = int64_t{1} << 60;

// Closes a descriptor on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string json_brief(const json& j) {
  std::string s = j.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// An unsigned integer that fits size_t/int64, or nullopt.
std::optional<uint64_t> as_u64(const json& j) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v >= 0) return static_cast<uint64_t>(v);
  }
  return std::nullopt;
}

TensorInfo parse_entry(const std::string& path, const std::string& name, const json& e) {
  DI_CHECK(e.is_object(), "safetensors file {}: header entry for tensor {} is not an object (got {})", path, name,
           json_brief(e));
  TensorInfo ti;
  ti.name = name;

  auto dt = e.find("dtype");
  DI_CHECK(dt != e.end(), "safetensors file {}: tensor {} has no dtype", path, name);
  DI_CHECK(dt->is_string(), "safetensors file {}: tensor {} has a non-string dtype {}", path, name, json_brief(*dt));
  const std::string dts = dt->get<std::string>();
  auto dtype = dtype_from_safetensors(dts);
  DI_CHECK(dtype.has_value(),
           "safetensors file {}: tensor {} has unknown dtype '{}' (supported: F32, BF16, F16, F8_E4M3, "
           "F8_E8M0, I8, U8, I32, I64)",
           path, name, dts);
  ti.dtype = *dtype;

  auto sh = e.find("shape");
  DI_CHECK(sh != e.end(), "safetensors file {}: tensor {} has no shape", path, name);
  DI_CHECK(sh->is_array(), "safetensors file {}: tensor {} has a shape that is not a list: {}", path, name,
           json_brief(*sh));
  int64_t numel = 1;
  for (const auto& d : *sh) {
    auto v = as_u64(d);
    DI_CHECK(v.has_value(),
             "safetensors file {}: tensor {} has shape {} with an entry that is not a "
             "non-negative integer",
             path, name, json_brief(*sh));
    DI_CHECK(*v <= static_cast<uint64_t>(kMaxNumel), "safetensors file {}: tensor {} has an absurd shape {}", path,
             name, json_brief(*sh));
    const auto dim = static_cast<int64_t>(*v);
    ti.shape.push_back(dim);
    if (dim != 0 && numel > kMaxNumel / dim) {
      fail("safetensors file {}: tensor {} has an absurd shape {} (element count overflows)", path, name,
           json_brief(*sh));
    }
    numel *= dim;
  }

  auto off = e.find("data_offsets");
  DI_CHECK(off != e.end(), "safetensors file {}: tensor {} has no data_offsets", path, name);
  DI_CHECK(off->is_array() && off->size() == 2,
           "safetensors file {}: tensor {} has data_offsets {}, expected [begin, end]", path, name, json_brief(*off));
  auto b = as_u64((*off)[0]);
  auto en = as_u64((*off)[1]);
  DI_CHECK(b.has_value() && en.has_value(),
           "safetensors file {}: tensor {} has data_offsets {} that are not non-negative integers", path, name,
           json_brief(*off));
  DI_CHECK(*b <= *en, "safetensors file {}: tensor {} has data_offsets [{}, {}] with begin after end", path, name, *b,
           *en);
  const size_t want = dtype_nbytes(ti.dtype, numel);
  DI_CHECK(*en - *b == want,
           "safetensors file {}: tensor {} spans {} bytes (data_offsets [{}, {}]) but {} {} needs {} bytes", path, name,
           *en - *b, *b, *en, dts, shape_str(ti.shape), want);
  ti.begin = static_cast<size_t>(*b);
  ti.end = static_cast<size_t>(*en);
  return ti;
}

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  Fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  DI_CHECK(fd.fd >= 0, "cannot open safetensors file {}: {}", path, std::strerror(errno));
  struct stat st {};
  DI_CHECK(::fstat(fd.fd, &st) == 0, "cannot stat safetensors file {}: {}", path, std::strerror(errno));
  DI_CHECK(S_ISREG(st.st_mode), "safetensors file {} is not a regular file", path);
  const auto file_size = static_cast<size_t>(st.st_size);
  DI_CHECK(file_size >= 8, "safetensors file {} is truncated: {} bytes, too short for the 8-byte header length", path,
           file_size);

  void* addr = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  DI_CHECK(addr != MAP_FAILED, "cannot mmap safetensors file {} ({} bytes): {}", path, file_size, std::strerror(errno));
  auto self = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  self->path_ = path;
  self->mapping_ = std::shared_ptr<void>(addr, [file_size](void* p) { ::munmap(p, file_size); });
  const auto* base = static_cast<const unsigned char*>(addr);

  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | base[i];
  DI_CHECK(n <= kMaxHeaderBytes,
           "safetensors file {}: corrupt header length {} (more than {} bytes; not a safetensors file?)", path, n,
           kMaxHeaderBytes);
  DI_CHECK(n <= file_size - 8,
           "safetensors file {}: corrupt header length {}: only {} bytes follow the 8-byte length (file "
           "truncated or not safetensors)",
           path, n, file_size - 8);
  DI_CHECK(n >= 2, "safetensors file {}: header length {} is too small for a JSON object", path, n);

  const char* hbeg = reinterpret_cast<const char*>(base + 8);
  json header;
  try {
    header = json::parse(hbeg, hbeg + n);
  } catch (const json::parse_error& e) {
    fail("safetensors file {}: header is not valid JSON: {}", path, e.what());
  }
  DI_CHECK(header.is_object(), "safetensors file {}: header is a JSON {}, expected an object", path,
           header.type_name());

  self->data_ = hbeg + n;
  self->data_size_ = file_size - 8 - static_cast<size_t>(n);

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      DI_CHECK(it->is_object(), "safetensors file {}: __metadata__ is not an object (got {})", path, json_brief(*it));
      for (auto m = it->begin(); m != it->end(); ++m) {
        DI_CHECK(m->is_string(), "safetensors file {}: __metadata__ entry '{}' is not a string (got {})", path, m.key(),
                 json_brief(*m));
        self->metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    self->tensors_[it.key()] = parse_entry(path, it.key(), *it);
  }

  // Bounds: report the tensor reaching furthest past the end, with how much is missing.
  const TensorInfo* furthest = nullptr;
  for (const auto& [name, ti] : self->tensors_) {
    if (ti.end > self->data_size_ && (!furthest || ti.end > furthest->end)) furthest = &ti;
  }
  if (furthest) {
    fail(
        "safetensors file {} is truncated: tensor {} ends at byte {} of the data section, which has only {} "
        "bytes ({} bytes missing)",
        path, furthest->name, furthest->end, self->data_size_, furthest->end - self->data_size_);
  }

  // Overlaps: sort non-empty ranges by start; each must begin at or after the previous one's end.
  std::vector<const TensorInfo*> ranges;
  for (const auto& [name, ti] : self->tensors_) {
    if (ti.end > ti.begin) ranges.push_back(&ti);
  }
  std::sort(ranges.begin(), ranges.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  const TensorInfo* prev = nullptr;
  for (const TensorInfo* ti : ranges) {
    if (prev && ti->begin < prev->end) {
      fail("safetensors file {}: tensor {} (bytes [{}, {})) overlaps tensor {} (bytes [{}, {}))", path, ti->name,
           ti->begin, ti->end, prev->name, prev->begin, prev->end);
    }
    if (!prev || ti->end > prev->end) prev = ti;
  }
  return self;
}

Tensor SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  DI_CHECK(it != tensors_.end(), "safetensors file {}: no tensor {}", path_, name);
  const TensorInfo& ti = it->second;
  const char* p = data_ + ti.begin;
  const size_t align = std::max<size_t>(1, static_cast<size_t>(dtype_bits(ti.dtype) / 8));
  if (reinterpret_cast<uintptr_t>(p) % align != 0) {
    // The format does not promise alignment; typed access needs it, so misaligned data is copied.
    Tensor t = Tensor::empty(ti.shape, ti.dtype);
    std::memcpy(t.raw(), p, ti.end - ti.begin);
    return t;
  }
  return Tensor::borrow(const_cast<char*>(p), ti.shape, ti.dtype, mapping_);
}

}  // namespace deepinfer
