#pragma once
// Megatron's indexed dataset (PREFIX.bin + PREFIX.idx), byte-compatible with
// megatron/core/datasets/indexed_dataset.py. The .idx layout is in DESIGN.md ("Compatibility
// contracts"): a 34-byte header, i32 sequence lengths, i64 byte offsets, i64 document bounds.
// The reader maps both files and validates every header field and offset before use, so a
// truncated or corrupt file fails with its name instead of reading out of bounds. The writer
// streams (memory does not grow with the dataset) and writes temporary names that are renamed
// only by finalize(), so an interrupted run leaves nothing that looks complete.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace mt::data {

// Megatron's DType codes.
enum class DType : uint8_t { U8 = 1, I8 = 2, I16 = 3, I32 = 4, I64 = 5, F64 = 6, F32 = 7, U16 = 8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // numpy's name: "uint16", "int32", ...
bool dtype_from_code(uint8_t code, DType* out);
// Megatron's DType.optimal_dtype: uint16 when the vocabulary is below 65500 ids, else int32.
DType optimal_dtype(int64_t vocab_size);

inline std::string idx_path(const std::string& prefix) { return prefix + ".idx"; }
inline std::string bin_path(const std::string& prefix) { return prefix + ".bin"; }
bool indexed_dataset_exists(const std::string& prefix);

// ".tmp.<pid>.<n>", unique per process and call, so concurrent writers (ranks, or threads of one
// process) never share a temporary file.
std::string temp_suffix();
// Writes `data` to `path` through a temporary file and a rename (readers never see a part).
void write_file_atomically(const std::string& path, const std::string& data);

// A read-only memory map of a whole file (empty files map to nothing).
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);  // throws mt::Error naming the file
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void reset();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

class IndexedDataset {
 public:
  // Opens PREFIX.idx and PREFIX.bin; throws mt::Error naming the file and what is wrong.
  explicit IndexedDataset(const std::string& prefix);

  const std::string& prefix() const { return prefix_; }
  DType dtype() const { return dtype_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return num_doc_bounds_ - 1; }
  int64_t num_tokens() const { return num_tokens_; }
  int32_t max_sequence_length() const { return max_len_; }

  // The arrays are packed and unaligned in the file, so they are read through memcpy.
  int32_t sequence_length(int64_t i) const { return load<int32_t>(lengths_ + 4 * i); }
  int64_t sequence_pointer(int64_t i) const { return load<int64_t>(pointers_ + 8 * i); }
  // Document d holds sequences [document_bound(d), document_bound(d + 1)).
  int64_t document_bound(int64_t d) const { return load<int64_t>(doc_bounds_ + 8 * d); }
  std::vector<int32_t> sequence_lengths() const;

  // Tokens [offset, offset + length) of sequence `seq`, converted to the output type.
  void read(int64_t seq, int64_t offset, int64_t length, int32_t* out) const;
  void read(int64_t seq, int64_t offset, int64_t length, int64_t* out) const;
  std::vector<int64_t> get(int64_t seq) const;

  const MappedFile& bin() const { return bin_; }

 private:
  template <typename T>
  static T load(const uint8_t* p) {
    T v;
    __builtin_memcpy(&v, p, sizeof(T));
    return v;
  }
  template <typename Out>
  void read_as(int64_t seq, int64_t offset, int64_t length, Out* out) const;
  void validate();

  std::string prefix_;
  MappedFile idx_, bin_;
  DType dtype_ = DType::I32;
  int64_t num_sequences_ = 0, num_doc_bounds_ = 0, num_tokens_ = 0;
  int32_t max_len_ = 0;
  const uint8_t* lengths_ = nullptr;
  const uint8_t* pointers_ = nullptr;
  const uint8_t* doc_bounds_ = nullptr;
};

// Streaming writer for PREFIX.bin/.idx (Megatron's IndexedDatasetBuilder). Sequence lengths and
// document bounds are spilled to side files, so memory stays constant however large the output.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(std::string prefix, DType dtype);
  ~IndexedDatasetWriter();  // removes every temporary file unless finalize() succeeded
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // One sequence; values must fit the dtype (a token id that does not is an error).
  void add_item(const int32_t* ids, size_t n);
  void add_item(const int64_t* ids, size_t n);
  // Closes the current document (its sequences are those added since the last call).
  void end_document();
  // A whole document: `num_seqs` sequences with the given lengths, tokens back to back.
  // num_seqs == 0 records an empty document, as Megatron does.
  void add_document(const int32_t* ids, const int32_t* lengths, size_t num_seqs);
  // Appends every sequence and document of an existing dataset of the same dtype.
  void add_index(const std::string& prefix);
  // Writes the .idx, fsyncs, and renames both files into place.
  void finalize();

  DType dtype() const { return dtype_; }
  const std::string& prefix() const { return prefix_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return num_documents_; }
  int64_t num_tokens() const { return num_tokens_; }

 private:
  template <typename In>
  void add_item_impl(const In* ids, size_t n);
  void write(std::FILE* f, const std::string& name, const void* p, size_t bytes);
  void remove_temporaries();

  std::string prefix_;
  DType dtype_;
  std::string bin_tmp_, idx_tmp_, len_tmp_, doc_tmp_;
  std::FILE* bin_ = nullptr;
  std::FILE* lens_ = nullptr;
  std::FILE* docs_ = nullptr;
  std::vector<uint8_t> scratch_;
  int64_t num_sequences_ = 0, num_documents_ = 0, num_tokens_ = 0;
  bool finalized_ = false;
};

}  // namespace mt::data
