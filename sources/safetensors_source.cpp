// SafetensorsSource (a memory-mapped .safetensors file) and write_safetensors.
// The header itself is parsed by safetensors_format.cpp.
#include <graphkeep/core/check.h>
#include <graphkeep/sources/safetensors_source.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>

namespace gk {
namespace detail {

// A whole file mapped read-only; unmapped when the last owner lets go (see
// Note [Zero-copy tensors from a mapping]).
class MappedFile {
 public:
  MappedFile(const std::string& path, const std::string& label) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    GK_CHECK(WeightError, fd >= 0, label, ": cannot open it: ", std::strerror(errno));
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};  // the mapping outlives the descriptor
    struct stat st {};
    GK_CHECK(WeightError, ::fstat(fd, &st) == 0, label, ": cannot stat it: ", std::strerror(errno));
    GK_CHECK(WeightError, S_ISREG(st.st_mode), label, ": not a regular file");
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ == 0) return;  // mmap rejects length 0; the parser reports the short file
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    GK_CHECK(WeightError, p != MAP_FAILED, label, ": cannot map its ", size_,
             " bytes: ", std::strerror(errno));
    data_ = static_cast<const std::byte*>(p);
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace detail

at::ScalarType to_scalar_type(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::boolean: return at::kBool;
    case SafetensorsDtype::u8: return at::kByte;
    case SafetensorsDtype::i8: return at::kChar;
    case SafetensorsDtype::i16: return at::kShort;
    case SafetensorsDtype::i32: return at::kInt;
    case SafetensorsDtype::i64: return at::kLong;
    case SafetensorsDtype::f16: return at::kHalf;
    case SafetensorsDtype::bf16: return at::kBFloat16;
    case SafetensorsDtype::f32: return at::kFloat;
    case SafetensorsDtype::f64: return at::kDouble;
    case SafetensorsDtype::f8_e4m3: return at::kFloat8_e4m3fn;
    case SafetensorsDtype::f8_e5m2: return at::kFloat8_e5m2;
  }
  GK_INTERNAL_ASSERT(false, "unhandled safetensors dtype ", static_cast<int>(dtype));
}

std::optional<SafetensorsDtype> to_safetensors_dtype(at::ScalarType type) {
  for (const SafetensorsDtype d : safetensors_dtypes())
    if (to_scalar_type(d) == type) return d;
  return std::nullopt;
}

SafetensorsSource::SafetensorsSource(std::string path) : path_(std::move(path)) {
  const std::string label = describe();
  file_ = std::make_shared<const detail::MappedFile>(path_, label);
  header_ = parse_safetensors_header(file_->bytes(), label);
}

SafetensorsSource::~SafetensorsSource() = default;

std::string SafetensorsSource::describe() const { return "safetensors file '" + path_ + "'"; }

std::span<const std::byte> SafetensorsSource::mapped_bytes() const { return file_->bytes(); }

std::optional<NamedTensor> SafetensorsSource::next() {
  if (pos_ >= header_.tensors.size()) return std::nullopt;
  const SafetensorsEntry& e = header_.tensors[pos_++];
  const auto options = at::TensorOptions().dtype(to_scalar_type(e.dtype));
  // In bounds: the parser checked [begin, end) against the data section.
  const std::byte* data = file_->bytes().data() + header_.data_offset + e.begin;
  const auto itemsize = safetensors_itemsize(e.dtype);

  at::Tensor value;
  if (e.byte_size() == 0) {
    value = at::empty(e.shape, options);
  } else if (reinterpret_cast<std::uintptr_t>(data) % itemsize != 0) {
    value = at::empty(e.shape, options);  // misaligned: copy (Note [Zero-copy tensors ...])
    std::memcpy(value.data_ptr(), data, e.byte_size());
  } else {
    value = at::from_blob(const_cast<std::byte*>(data), e.shape,
                          [keep = file_](void*) mutable { keep.reset(); }, options);
  }
  return NamedTensor{e.name, std::move(value), 0};
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string label = "safetensors file '" + path + "'";
  std::vector<at::Tensor> data;
  data.reserve(tensors.size());
  std::set<std::string_view> names;
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    GK_CHECK(WeightError, t.name != "__metadata__", label,
             ": a tensor cannot be named '__metadata__' (the format reserves the name)");
    GK_CHECK(WeightError, names.insert(t.name).second, label, ": tensor '", t.name,
             "' is given twice; each name may appear once");
    GK_CHECK(WeightError, t.shard == 0, label, ": tensor '", t.name, "' is shard ", t.shard,
             "; the format stores whole tensors, so concatenate the shards first");
    GK_CHECK(WeightError, t.value.defined(), label, ": tensor '", t.name, "' is undefined");
    GK_CHECK(WeightError, t.value.layout() == at::kStrided, label, ": tensor '", t.name,
             "' has layout ", t.value.layout(), "; only strided tensors can be written");
    const auto dtype = to_safetensors_dtype(t.value.scalar_type());
    GK_CHECK(WeightError, dtype.has_value(), label, ": tensor '", t.name, "' has dtype ",
             t.value.scalar_type(), ", which graphkeep cannot store in safetensors");
    at::Tensor v = t.value.to(at::kCPU).contiguous();
    const auto nbytes = static_cast<std::uint64_t>(v.nbytes());
    header[t.name] = {{"dtype", std::string(safetensors_dtype_name(*dtype))},
                      {"shape", v.sizes().vec()},
                      {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    data.push_back(std::move(v));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned

  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    GK_CHECK(WeightError, out.is_open(), label, ": cannot create '", tmp,
             "': ", std::strerror(errno));
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(text.size() >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), sizeof len);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const at::Tensor& v : data)
      if (v.nbytes() > 0)
        out.write(static_cast<const char*>(v.const_data_ptr()),
                  static_cast<std::streamsize>(v.nbytes()));
    out.close();
    if (!out) {
      const int err = errno;
      std::remove(tmp.c_str());
      GK_CHECK(WeightError, false, label, ": writing '", tmp, "' failed: ", std::strerror(err));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    GK_CHECK(WeightError, false, label, ": cannot rename '", tmp, "' to it: ", std::strerror(err));
  }
}

}  // namespace gk
