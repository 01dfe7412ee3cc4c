// A whole file mapped read-only. Checkpoint weights are used in place from the
// mapping: the OS pages them in on first touch and may drop them under memory
// pressure, so opening a 140 GB checkpoint costs no RAM up front.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>

namespace shardlm {

class MappedFile {
 public:
  MappedFile() = default;
  // Throws Error: kNotFound if the path does not exist, kIo if it cannot be
  // opened or mapped (a directory, no permission, ...).
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // The file's bytes; empty for an empty file. Valid while this object lives
  // (moves keep the address).
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  uint64_t size() const { return size_; }

 private:
  void release();
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace shardlm
