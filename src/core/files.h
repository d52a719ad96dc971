#pragma once
// Checks on paths a user hands us before they are opened: a FIFO, a device or a directory named
// where a data file is expected would otherwise hang a read or fail with a library's exception.
#include <cstdint>
#include <string>

namespace mt {

// Throws mt::Error naming `what` (a flag or a role, e.g. "--load" or "checkpoint shard") and the
// path when `path` does not exist or is not a regular file (after following links).
void require_regular_file(const std::string& path, const std::string& what);

// Opens `path` read-only with O_NONBLOCK (so a FIFO cannot block the open waiting for a writer),
// then refuses, closing it, anything but a regular file, with require_regular_file's messages.
// Returns the descriptor (the caller closes it) and the file's size in `size`.
int open_regular_file(const std::string& path, const std::string& what, uint64_t* size);

// True when `path` exists and is a regular file (after following links).
bool is_regular_file(const std::string& path);

}  // namespace mt
