#pragma once
// Small file helpers shared by the checkpoint writers and readers: every write names its file
// in the error, and durability comes from fsyncing files and then their directory. Files are
// created exclusively and never through a symbolic link, so a link planted at a temporary name
// (latest_checkpointed_iteration.txt.tmp -> ~/.bashrc) cannot redirect a write; reads refuse
// anything but regular files, so a FIFO or a device named as a checkpoint file cannot hang them.
#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace mt::checkpoint {

void fsync_path(const std::filesystem::path& p);

// A file being written: created with O_CREAT | O_EXCL | O_NOFOLLOW after removing whatever
// non-directory entry had its name (a leftover of a killed save, or a planted link: the link
// itself goes, its target is untouched). Throws mt::Error naming the file.
class NewFile {
 public:
  explicit NewFile(const std::filesystem::path& p);
  ~NewFile();
  NewFile(const NewFile&) = delete;
  NewFile& operator=(const NewFile&) = delete;
  void write(const void* data, size_t n);
  void sync_and_close();  // fsync, then close; errors (a full disk) throw

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

// Writes `text` to p.tmp (a NewFile), fsyncs it and renames it to p: a reader sees the old file
// or the new one.
void write_text_durable(const std::filesystem::path& p, const std::string& text);
// Reads a whole regular file; `what` names its role in errors (e.g. "--load").
std::string read_text(const std::filesystem::path& p, const std::string& what = "checkpoint");
nlohmann::json parse_json_file(const std::filesystem::path& p, const std::string& what = "checkpoint");
// Parses `text`; syntax errors throw mt::Error "'<where>' is corrupt: ...".
nlohmann::json parse_json_text(const std::string& text, const std::string& where);

// True for a plain file name inside one directory: not empty, not "." or "..", no '/' and no NUL.
// File names read from metadata.json and HF index files must be such names, so they cannot
// reach outside the directory holding them.
bool is_plain_file_name(const std::string& name);

}  // namespace mt::checkpoint
