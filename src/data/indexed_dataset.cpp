#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/error.h"
#include "core/files.h"

namespace mt::data {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;
constexpr size_t kWriteBuffer = 1 << 20;

std::string errno_text() { return std::strerror(errno); }

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

std::FILE* open_for_write(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail("cannot create {}: {} (check that the directory exists and is writable)", path, errno_text());
  std::setvbuf(f, nullptr, _IOFBF, kWriteBuffer);
  return f;
}

void close_file(std::FILE*& f) {
  if (f) std::fclose(f);
  f = nullptr;
}

// Calls f(T{}) with the C++ element type of a .bin file's dtype.
template <typename F>
void with_element_type(DType d, F&& f) {
  switch (d) {
    case DType::U8: f(uint8_t{}); break;
    case DType::I8: f(int8_t{}); break;
    case DType::I16: f(int16_t{}); break;
    case DType::U16: f(uint16_t{}); break;
    case DType::I32: f(int32_t{}); break;
    case DType::I64: f(int64_t{}); break;
    case DType::F32: f(float{}); break;
    case DType::F64: f(double{}); break;
  }
}

}  // namespace

size_t dtype_size(DType t) {
  switch (t) {
    case DType::U8: case DType::I8: return 1;
    case DType::I16: case DType::U16: return 2;
    case DType::I32: case DType::F32: return 4;
    case DType::I64: case DType::F64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::U8: return "uint8";
    case DType::I8: return "int8";
    case DType::I16: return "int16";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::F64: return "float64";
    case DType::F32: return "float32";
    case DType::U16: return "uint16";
  }
  return "?";
}

bool dtype_from_code(uint8_t code, DType* out) {
  if (code < 1 || code > 8) return false;
  *out = static_cast<DType>(code);
  return true;
}

DType optimal_dtype(int64_t vocab_size) { return vocab_size < 65500 ? DType::U16 : DType::I32; }

std::string temp_suffix() {
  static std::atomic<uint64_t> counter{0};
  return ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

void write_file_atomically(const std::string& path, const std::string& data) {
  const std::string tmp = path + temp_suffix();
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("cannot create {}: {}", tmp, errno_text());
  bool ok = std::fwrite(data.data(), 1, data.size(), f) == data.size();
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    std::remove(tmp.c_str());
    fail("writing {} failed: {} (disk full?)", path, why);
  }
}

bool indexed_dataset_exists(const std::string& prefix) {
  return std::filesystem::is_regular_file(idx_path(prefix)) &&
         std::filesystem::is_regular_file(bin_path(prefix));
}

// ---------------------------------------------------------------- MappedFile

MappedFile::MappedFile(const std::string& path) : path_(path) {
  uint64_t size = 0;
  int fd = open_regular_file(path, "data file", &size);  // a FIFO or device would hang a read
  size_ = static_cast<size_t>(size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      fail("cannot map {}: {}", path, errno_text());
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() { reset(); }

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    reset();
    path_ = std::move(o.path_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

void MappedFile::reset() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

// ---------------------------------------------------------------- IndexedDataset

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string ip = idx_path(prefix), bp = bin_path(prefix);
  if (!std::filesystem::exists(ip) || !std::filesystem::exists(bp)) {
    fail("dataset {} not found: need both {} and {} (write them with 'megatron preprocess')",
         prefix, ip, bp);
  }
  require_regular_file(ip, "dataset " + prefix);
  require_regular_file(bp, "dataset " + prefix);
  idx_ = MappedFile(ip);
  bin_ = MappedFile(bp);
  validate();
}

void IndexedDataset::validate() {
  const std::string& ip = idx_.path();
  const uint8_t* p = idx_.data();
  const size_t size = idx_.size();
  if (size < kHeaderBytes) {
    fail("{} is {} bytes, shorter than the {}-byte header (truncated); re-run preprocess", ip, size,
         kHeaderBytes);
  }
  if (std::memcmp(p, kMagic, sizeof(kMagic)) != 0) {
    fail("{} is not a Megatron index file (its first bytes are not MMIDIDX\\0\\0)", ip);
  }
  const uint64_t version = load<uint64_t>(p + 9);
  if (version != 1) fail("{} has index version {}; only version 1 is supported", ip, version);
  if (!dtype_from_code(p[17], &dtype_)) {
    fail("{} has unknown dtype code {} (valid codes are 1..8); the file is corrupt", ip, p[17]);
  }
  const uint64_t n = load<uint64_t>(p + 18), d = load<uint64_t>(p + 26);
  // Bound the counts by the file size before multiplying so a corrupt header cannot overflow.
  const uint64_t body = size - kHeaderBytes;
  if (n > body / 12 || d > body / 8 || 12 * n + 8 * d > body) {
    fail("{} is truncated or corrupt: its header declares {} sequences and {} document bounds, "
         "more than the {} bytes after the header hold; re-run preprocess", ip, n, d, body);
  }
  const uint64_t need = 12 * n + 8 * d;
  // Multimodal indices carry one extra i8 mode per sequence; anything else is corruption.
  if (body != need && body != need + n) {
    fail("{} has {} bytes after its header but {} sequences and {} document bounds need {}; "
         "the file is corrupt", ip, body, n, d, need);
  }
  if (d < 1) fail("{} has no document bounds (needs at least the leading 0); the file is corrupt", ip);
  num_sequences_ = static_cast<int64_t>(n);
  num_doc_bounds_ = static_cast<int64_t>(d);
  lengths_ = p + kHeaderBytes;
  pointers_ = lengths_ + 4 * n;
  doc_bounds_ = pointers_ + 8 * n;

  if (document_bound(0) != 0 || document_bound(num_doc_bounds_ - 1) != num_sequences_) {
    fail("{} document bounds must run from 0 to the sequence count {} (found {} .. {}); the file "
         "is corrupt", ip, num_sequences_, document_bound(0), document_bound(num_doc_bounds_ - 1));
  }
  for (int64_t i = 1; i < num_doc_bounds_; ++i) {
    if (document_bound(i) < document_bound(i - 1)) {
      fail("{} document bound {} ({}) is below the previous one ({}); the file is corrupt", ip, i,
           document_bound(i), document_bound(i - 1));
    }
  }
  const int64_t isz = static_cast<int64_t>(dtype_size(dtype_));
  const int64_t bin_size = static_cast<int64_t>(bin_.size());
  num_tokens_ = 0;
  for (int64_t i = 0; i < num_sequences_; ++i) {
    const int64_t len = sequence_length(i), ptr = sequence_pointer(i);
    if (len < 0) fail("{} sequence {} has negative length {}; the file is corrupt", ip, i, len);
    if (ptr < 0 || ptr > bin_size || len > (bin_size - ptr) / isz) {
      // The message names the length, not the end byte: ptr + len * isz can overflow int64 for
      // a corrupt length (a fuzzing finding).
      fail("{} is truncated or does not match {}: sequence {} needs {} tokens of {} bytes from byte {} but "
           "the .bin has {} bytes; re-run preprocess", bin_.path(), ip, i, len, isz, ptr, bin_size);
    }
    num_tokens_ += len;
    if (len > max_len_) max_len_ = static_cast<int32_t>(len);
  }
}

std::vector<int32_t> IndexedDataset::sequence_lengths() const {
  std::vector<int32_t> out(static_cast<size_t>(num_sequences_));
  if (!out.empty()) std::memcpy(out.data(), lengths_, out.size() * 4);
  return out;
}

template <typename Out>
void IndexedDataset::read_as(int64_t seq, int64_t offset, int64_t length, Out* out) const {
  MT_CHECK(seq >= 0 && seq < num_sequences_, "sequence {} of {}", seq, num_sequences_);
  MT_CHECK(offset >= 0 && length >= 0 && offset + length <= sequence_length(seq),
           "tokens [{}, {}) of sequence {} (length {}) in {}", offset, offset + length, seq,
           sequence_length(seq), prefix_);
  const size_t isz = dtype_size(dtype_);
  const uint8_t* src = bin_.data() + sequence_pointer(seq) + offset * static_cast<int64_t>(isz);
  auto convert = [&](auto tag) {
    using T = decltype(tag);
    for (int64_t i = 0; i < length; ++i) {
      const T v = load<T>(src + i * sizeof(T));
      if constexpr (std::is_floating_point_v<T> && std::is_integral_v<Out>) {
        // A float .bin read as token ids: NaN, infinities and values beyond the id type would be
        // undefined to convert (found by fuzz_idx).
        if (!(v >= static_cast<T>(std::numeric_limits<Out>::min()) && v <= static_cast<T>(std::numeric_limits<Out>::max())))
          fail("{}.bin: token {} of sequence {} is {}, not a token id (a float dataset read as tokens)", prefix_,
               offset + i, seq, static_cast<double>(v));
      }
      out[i] = static_cast<Out>(v);
    }
  };
  with_element_type(dtype_, convert);
}

void IndexedDataset::read(int64_t seq, int64_t offset, int64_t length, int32_t* out) const {
  read_as(seq, offset, length, out);
}
void IndexedDataset::read(int64_t seq, int64_t offset, int64_t length, int64_t* out) const {
  read_as(seq, offset, length, out);
}

std::vector<int64_t> IndexedDataset::get(int64_t seq) const {
  std::vector<int64_t> out(static_cast<size_t>(sequence_length(seq)));
  read(seq, 0, static_cast<int64_t>(out.size()), out.data());
  return out;
}

// ---------------------------------------------------------------- IndexedDatasetWriter

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, DType dtype)
    : prefix_(std::move(prefix)), dtype_(dtype) {
  // Temporary names carry the pid so two runs writing the same prefix cannot corrupt each other.
  const std::string tag = temp_suffix();
  bin_tmp_ = bin_path(prefix_) + tag;
  idx_tmp_ = idx_path(prefix_) + tag;
  len_tmp_ = idx_path(prefix_) + tag + ".lengths";
  doc_tmp_ = idx_path(prefix_) + tag + ".docs";
  try {
    bin_ = open_for_write(bin_tmp_);
    lens_ = open_for_write(len_tmp_);
    docs_ = open_for_write(doc_tmp_);
  } catch (...) {
    remove_temporaries();
    throw;
  }
  const int64_t zero = 0;
  write(docs_, doc_tmp_, &zero, sizeof(zero));
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (!finalized_) remove_temporaries();
}

void IndexedDatasetWriter::remove_temporaries() {
  close_file(bin_);
  close_file(lens_);
  close_file(docs_);
  for (const auto* p : {&bin_tmp_, &idx_tmp_, &len_tmp_, &doc_tmp_}) {
    if (!p->empty()) std::remove(p->c_str());
  }
}

void IndexedDatasetWriter::write(std::FILE* f, const std::string& name, const void* p, size_t bytes) {
  if (bytes && std::fwrite(p, 1, bytes, f) != bytes) {
    fail("writing {} failed: {} (disk full?)", name, errno_text());
  }
}

template <typename In>
void IndexedDatasetWriter::add_item_impl(const In* ids, size_t n) {
  MT_CHECK(!finalized_, "add_item after finalize");
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    fail("a sequence of {} tokens does not fit the .idx format's int32 lengths ({})", n, prefix_);
  }
  const size_t isz = dtype_size(dtype_);
  scratch_.resize(n * isz);
  uint8_t* dst = scratch_.data();
  auto convert = [&](auto tag) {
    using T = decltype(tag);
    for (size_t i = 0; i < n; ++i) {
      const int64_t v = static_cast<int64_t>(ids[i]);
      if constexpr (std::is_integral_v<T>) {
        if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
            v > static_cast<int64_t>(std::numeric_limits<T>::max())) {
          fail("token id {} does not fit {}'s dtype {}; use a dtype that holds the vocabulary",
               v, bin_path(prefix_), dtype_name(dtype_));
        }
      }
      const T t = static_cast<T>(v);
      std::memcpy(dst + i * sizeof(T), &t, sizeof(T));
    }
  };
  with_element_type(dtype_, convert);
  write(bin_, bin_tmp_, dst, n * isz);
  const int32_t len = static_cast<int32_t>(n);
  write(lens_, len_tmp_, &len, sizeof(len));
  ++num_sequences_;
  num_tokens_ += static_cast<int64_t>(n);
}

void IndexedDatasetWriter::add_item(const int32_t* ids, size_t n) { add_item_impl(ids, n); }
void IndexedDatasetWriter::add_item(const int64_t* ids, size_t n) { add_item_impl(ids, n); }

void IndexedDatasetWriter::end_document() {
  write(docs_, doc_tmp_, &num_sequences_, sizeof(num_sequences_));
  ++num_documents_;
}

void IndexedDatasetWriter::add_document(const int32_t* ids, const int32_t* lengths, size_t num_seqs) {
  for (size_t s = 0; s < num_seqs; ++s) {
    add_item(ids, static_cast<size_t>(lengths[s]));
    ids += lengths[s];
  }
  end_document();
}

void IndexedDatasetWriter::add_index(const std::string& prefix) {
  IndexedDataset src(prefix);
  if (src.dtype() != dtype_) {
    fail("cannot merge {} (dtype {}) into {} (dtype {}): all inputs must share one dtype", prefix,
         dtype_name(src.dtype()), prefix_, dtype_name(dtype_));
  }
  const int64_t base = num_sequences_;
  const int64_t n = src.num_sequences();
  for (int64_t i = 0; i < n; ++i) {
    const int32_t len = src.sequence_length(i);
    write(lens_, len_tmp_, &len, sizeof(len));
    num_tokens_ += len;
  }
  for (int64_t d = 1; d <= src.num_documents(); ++d) {
    const int64_t bound = base + src.document_bound(d);
    write(docs_, doc_tmp_, &bound, sizeof(bound));
  }
  // Megatron appends the whole .bin (shutil.copyfileobj), whatever its pointers say.
  write(bin_, bin_tmp_, src.bin().data(), src.bin().size());
  num_sequences_ += n;
  num_documents_ += src.num_documents();
}

void IndexedDatasetWriter::finalize() {
  MT_CHECK(!finalized_, "finalize twice");
  auto flush_close = [&](std::FILE*& f, const std::string& name, bool sync) {
    if (std::fflush(f) != 0 || (sync && ::fsync(::fileno(f)) != 0)) {
      fail("writing {} failed: {} (disk full?)", name, errno_text());
    }
    close_file(f);
  };
  flush_close(bin_, bin_tmp_, true);
  flush_close(lens_, len_tmp_, false);
  flush_close(docs_, doc_tmp_, false);

  std::FILE* idx = open_for_write(idx_tmp_);
  struct Closer {
    std::FILE*& f;
    ~Closer() { close_file(f); }
  } closer{idx};
  std::vector<uint8_t> header(kMagic, kMagic + sizeof(kMagic));
  put<uint64_t>(header, 1);
  put<uint8_t>(header, static_cast<uint8_t>(dtype_));
  put<uint64_t>(header, static_cast<uint64_t>(num_sequences_));
  put<uint64_t>(header, static_cast<uint64_t>(num_documents_ + 1));
  write(idx, idx_tmp_, header.data(), header.size());

  // Lengths are copied as they are; pointers are their running byte sum (a second pass).
  auto stream = [&](const std::string& path, auto&& on_chunk) {
    std::FILE* in = std::fopen(path.c_str(), "rb");
    if (!in) fail("cannot reopen {}: {}", path, errno_text());
    std::vector<uint8_t> buf(kWriteBuffer);
    size_t got;
    while ((got = std::fread(buf.data(), 1, buf.size(), in)) > 0) on_chunk(buf.data(), got);
    const bool bad = std::ferror(in);
    std::fclose(in);
    if (bad) fail("reading {} failed: {}", path, errno_text());
  };
  stream(len_tmp_, [&](const uint8_t* p, size_t n) { write(idx, idx_tmp_, p, n); });
  const int64_t isz = static_cast<int64_t>(dtype_size(dtype_));
  int64_t ptr = 0;
  std::vector<int64_t> ptrs;
  stream(len_tmp_, [&](const uint8_t* p, size_t n) {
    MT_CHECK(n % 4 == 0, "lengths spill file read in a partial record");
    ptrs.resize(n / 4);
    for (size_t i = 0; i < n / 4; ++i) {
      int32_t len;
      std::memcpy(&len, p + 4 * i, 4);
      ptrs[i] = ptr;
      ptr += len * isz;
    }
    write(idx, idx_tmp_, ptrs.data(), ptrs.size() * 8);
  });
  stream(doc_tmp_, [&](const uint8_t* p, size_t n) { write(idx, idx_tmp_, p, n); });
  flush_close(idx, idx_tmp_, true);

  // The .bin goes into place first: a reader needs both files, and the .idx appears last.
  const std::string bp = bin_path(prefix_), ip = idx_path(prefix_);
  std::remove(ip.c_str());  // an old .idx must not pair with the new .bin, even briefly
  if (std::rename(bin_tmp_.c_str(), bp.c_str()) != 0) fail("cannot rename {} to {}: {}", bin_tmp_, bp, errno_text());
  if (std::rename(idx_tmp_.c_str(), ip.c_str()) != 0) fail("cannot rename {} to {}: {}", idx_tmp_, ip, errno_text());
  std::remove(len_tmp_.c_str());
  std::remove(doc_tmp_.c_str());
  finalized_ = true;
}

}  // namespace mt::data
