#pragma once
// MD5 of a dataset description: the key Megatron uses to name its index caches. Not used for
// security, only to give a stable file name to a long description.
#include <string>
#include <string_view>

namespace mt::data {
std::string md5_hex(std::string_view data);  // lower-case hex digest, like hashlib's hexdigest()
}  // namespace mt::data
