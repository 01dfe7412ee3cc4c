#include "loader/sha256.h"

#include <openssl/evp.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>

#include "core/error.h"

namespace shardlm {

namespace {

struct DigestContext {
  DigestContext() : ctx(EVP_MD_CTX_new()) {
    if (ctx == nullptr || EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) != 1)
      fail(ErrorCode::kInternal, "OpenSSL: cannot start a SHA-256 digest");
  }
  ~DigestContext() { EVP_MD_CTX_free(ctx); }
  void update(const void* data, size_t n) {
    if (EVP_DigestUpdate(ctx, data, n) != 1) fail(ErrorCode::kInternal, "OpenSSL: SHA-256 update failed");
  }
  std::string hex() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (EVP_DigestFinal_ex(ctx, digest, &n) != 1) fail(ErrorCode::kInternal, "OpenSSL: SHA-256 final failed");
    static const char* kHex = "0123456789abcdef";
    std::string out;
    for (unsigned int i = 0; i < n; ++i) {
      out += kHex[digest[i] >> 4];
      out += kHex[digest[i] & 15];
    }
    return out;
  }
  EVP_MD_CTX* ctx;
};

}  // namespace

std::string sha256_bytes(std::string_view bytes) {
  DigestContext digest;
  digest.update(bytes.data(), bytes.size());
  return digest.hex();
}

std::string sha256_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) fail(ErrorCode::kNotFound, path.string(), ": no such file");
    fail(ErrorCode::kIo, path.string(), ": cannot open: ", std::strerror(errno));
  }
  DigestContext digest;
  std::unique_ptr<char[]> buffer(new char[1 << 20]);
  while (in) {
    in.read(buffer.get(), 1 << 20);
    if (in.gcount() > 0) digest.update(buffer.get(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) fail(ErrorCode::kIo, path.string(), ": read error while hashing");
  return digest.hex();
}

std::vector<ManifestEntry> parse_sha256_manifest(std::string_view text, std::vector<std::string>* bad_lines) {
  std::vector<ManifestEntry> out;
  size_t line_no = 0;
  while (!text.empty()) {
    size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line[0] == '#') continue;
    bool ok = line.size() > 66 && line[64] == ' ' && (line[65] == ' ' || line[65] == '*');
    for (size_t i = 0; ok && i < 64; ++i) ok = std::isxdigit(static_cast<unsigned char>(line[i])) != 0;
    if (!ok) {
      if (bad_lines != nullptr)
        bad_lines->push_back(str_cat("line ", line_no, ": ", line.substr(0, 80), line.size() > 80 ? "..." : ""));
      continue;
    }
    ManifestEntry entry;
    entry.sha256 = std::string(line.substr(0, 64));
    for (char& c : entry.sha256) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string_view name = line.substr(66);
    while (name.substr(0, 2) == "./") name.remove_prefix(2);
    entry.name = std::string(name);
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace shardlm
