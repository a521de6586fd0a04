// Token sources: the formats of [Note: the token files zerort reads], memory-mapped.
#include "zerort/data/token_source.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

constexpr char kZerortMagic[8] = {'Z', 'R', 'T', 'O', 'K', 'E', 'N', 'S'};
constexpr size_t kZerortHeader = 32;
constexpr uint32_t kLlmcMagic = 20240520;
constexpr size_t kLlmcHeader = 256 * 4;
constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kMegatronHeader = 9 + 8 + 1 + 8 + 8;

uint64_t LittleEndian(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

bool EndsWith(std::string_view s, std::string_view tail) { return s.ends_with(tail); }

// An open regular file: its descriptor (closed on destruction) and size.
struct File {
  int fd = -1;
  uint64_t size = 0;
  ~File() {
    if (fd >= 0) close(fd);
  }
};

StatusOr<std::unique_ptr<File>> OpenRegular(const std::string& path) {
  auto f = std::make_unique<File>();
  f->fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (f->fd < 0) {
    const int err = errno;
    return ErrnoError(StrCat("open token file ", path), err);
  }
  struct stat st {};
  if (fstat(f->fd, &st) != 0) {
    const int err = errno;
    return ErrnoError(StrCat("stat ", path), err);
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(StrCat(path, ": not a regular file"));
  }
  f->size = static_cast<uint64_t>(st.st_size);
  return f;
}

// `n` bytes at `offset`, or an error naming the file when it is shorter.
StatusOr<std::string> ReadAt(const File& f, const std::string& path, uint64_t offset, size_t n) {
  std::string out(n, '\0');
  size_t done = 0;
  while (done < n) {
    const ssize_t r = pread(f.fd, out.data() + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      return ErrnoError(StrCat("read ", path), err);
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  if (done < n) {
    return absl::InvalidArgumentError(
        StrCat(path, ": ", f.size, " bytes, shorter than the ", n, "-byte header"));
  }
  return out;
}

bool Exists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

// Megatron's dtype codes (megatron/core/datasets/indexed_dataset.py, DType): the integer ones.
struct MegatronDType {
  int width;
  bool is_signed;
  const char* name;
};
StatusOr<MegatronDType> MegatronDTypeOf(int code, const std::string& idx) {
  switch (code) {
    case 1:
      return MegatronDType{1, false, "uint8"};
    case 2:
      return MegatronDType{1, true, "int8"};
    case 3:
      return MegatronDType{2, true, "int16"};
    case 4:
      return MegatronDType{4, true, "int32"};
    case 5:
      return MegatronDType{8, true, "int64"};
    case 8:
      return MegatronDType{2, false, "uint16"};
    default:
      return absl::InvalidArgumentError(
          StrCat(idx, ": dtype code ", code,
                 " is not an integer token type (1-5 and 8: uint8, int8, int16, int32, int64, "
                 "uint16)"));
  }
}

}  // namespace

StatusOr<TokenFormat> ParseTokenFormat(std::string_view name) {
  if (name == "detect") return TokenFormat::kDetect;
  if (name == "uint16") return TokenFormat::kUint16;
  if (name == "uint32") return TokenFormat::kUint32;
  return absl::InvalidArgumentError(
      StrCat("token format '", name, "' (detect, uint16 or uint32 expected)"));
}

std::unique_ptr<TokenSource> TokenSource::FromTokens(std::vector<int32_t> tokens, int vocab_size,
                                                     std::string name) {
  std::unique_ptr<TokenSource> s(new TokenSource());
  s->memory_ = std::move(tokens);
  s->count_ = static_cast<int64_t>(s->memory_.size());
  s->vocab_ = vocab_size;
  s->name_ = std::move(name);
  return s;
}

TokenSource::~TokenSource() {
  if (map_ != nullptr) munmap(map_, map_bytes_);
}

StatusOr<std::unique_ptr<TokenSource>> TokenSource::Open(const std::string& path,
                                                         TokenFormat format) {
  std::unique_ptr<TokenSource> s(new TokenSource());
  s->name_ = path;
  // A Megatron dataset is named by its prefix or either of its files.
  std::string data_path = path;
  std::string idx_path;
  if (format == TokenFormat::kDetect) {
    const std::string prefix =
        EndsWith(path, ".idx") || EndsWith(path, ".bin") ? path.substr(0, path.size() - 4) : path;
    if (EndsWith(path, ".idx") || (!Exists(path) && Exists(prefix + ".idx"))) {
      idx_path = prefix + ".idx";
      data_path = prefix + ".bin";
    } else if (EndsWith(path, ".bin") && Exists(prefix + ".idx")) {
      idx_path = prefix + ".idx";  // unless the .bin has a header of its own (below)
    }
  }
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<File> file, OpenRegular(data_path));
  uint64_t header = 0;
  uint64_t count = 0;
  if (format == TokenFormat::kUint16 || format == TokenFormat::kUint32) {
    s->width_ = format == TokenFormat::kUint16 ? 2 : 4;
    s->format_ = format == TokenFormat::kUint16 ? "uint16" : "uint32";
    if (file->size % s->width_ != 0) {
      return absl::InvalidArgumentError(StrCat(
          data_path, ": ", file->size, " bytes is not a whole number of ", s->format_, " tokens"));
    }
    count = file->size / s->width_;
  } else {
    // The first bytes say which format it is.
    const size_t probe = static_cast<size_t>(std::min<uint64_t>(file->size, 8));
    ZR_ASSIGN_OR_RETURN(const std::string first, ReadAt(*file, data_path, 0, probe));
    const auto* p = reinterpret_cast<const unsigned char*>(first.data());
    // (A file cut inside the magic is a zerort file too short for its header.)
    const bool zerort = probe > 0 && std::memcmp(p, kZerortMagic, probe) == 0;
    const bool llmc = probe >= 4 && LittleEndian(p, 4) == kLlmcMagic;
    if (zerort) {
      idx_path.clear();
      s->format_ = "zerort";
      ZR_ASSIGN_OR_RETURN(const std::string h, ReadAt(*file, data_path, 0, kZerortHeader));
      const auto* q = reinterpret_cast<const unsigned char*>(h.data());
      const uint64_t version = LittleEndian(q + 8, 4);
      const uint64_t width = LittleEndian(q + 12, 4);
      count = LittleEndian(q + 16, 8);
      const uint64_t vocab = LittleEndian(q + 24, 4);
      if (version != 1) {
        return absl::InvalidArgumentError(
            StrCat(data_path, ": token-file version ", version, ", this zerort reads version 1"));
      }
      if (width != 1 && width != 2 && width != 4) {
        return absl::InvalidArgumentError(
            StrCat(data_path, ": token width ", width, " (1, 2 or 4 expected)"));
      }
      if (vocab < 1 || vocab > (uint64_t{1} << 31)) {
        return absl::InvalidArgumentError(StrCat(data_path, ": vocabulary size ", vocab));
      }
      s->width_ = static_cast<int>(width);
      s->vocab_ = static_cast<int>(vocab);
      header = kZerortHeader;
    } else if (llmc) {
      idx_path.clear();
      s->format_ = "llm.c";
      ZR_ASSIGN_OR_RETURN(const std::string h, ReadAt(*file, data_path, 0, kLlmcHeader));
      const auto* q = reinterpret_cast<const unsigned char*>(h.data());
      const uint64_t version = LittleEndian(q + 4, 4);
      if (version != 1 && version != 2) {
        return absl::InvalidArgumentError(
            StrCat(data_path, ": llm.c token shard version ", version, " (1: uint16, 2: uint32)"));
      }
      s->width_ = version == 1 ? 2 : 4;
      count = LittleEndian(q + 8, 4);
      header = kLlmcHeader;
    } else if (!idx_path.empty()) {
      s->format_ = "megatron";
      ZR_ASSIGN_OR_RETURN(std::unique_ptr<File> idx, OpenRegular(idx_path));
      ZR_ASSIGN_OR_RETURN(const std::string h, ReadAt(*idx, idx_path, 0, kMegatronHeader));
      const auto* q = reinterpret_cast<const unsigned char*>(h.data());
      if (std::memcmp(q, kMegatronMagic, sizeof(kMegatronMagic)) != 0) {
        return absl::InvalidArgumentError(
            StrCat(idx_path, ": not a Megatron index (no MMIDIDX magic)"));
      }
      const uint64_t version = LittleEndian(q + 9, 8);
      if (version != 1) {
        return absl::InvalidArgumentError(
            StrCat(idx_path, ": Megatron index version ", version, ", this zerort reads 1"));
      }
      ZR_ASSIGN_OR_RETURN(const MegatronDType dtype, MegatronDTypeOf(q[17], idx_path));
      const uint64_t sequences = LittleEndian(q + 18, 8);
      const uint64_t documents = LittleEndian(q + 26, 8);
      // sizes (4 bytes), pointers (8) per sequence, the document index (8) per document, and
      // optionally a mode byte per sequence (multimodal): compared by division, no overflow.
      const uint64_t rest = idx->size - kMegatronHeader;
      if (sequences > rest / 12 || documents > (rest - sequences * 12) / 8 ||
          (rest != sequences * 12 + documents * 8 && rest != sequences * 13 + documents * 8)) {
        return absl::InvalidArgumentError(StrCat(idx_path, ": ", sequences, " sequences and ",
                                                 documents, " documents do not fit its ", idx->size,
                                                 " bytes"));
      }
      s->width_ = dtype.width;
      s->is_signed_ = dtype.is_signed;
      if (file->size % dtype.width != 0) {
        return absl::InvalidArgumentError(StrCat(data_path, ": ", file->size,
                                                 " bytes is not a whole number of ", dtype.name,
                                                 " tokens (", idx_path, ")"));
      }
      count = file->size / dtype.width;
      if (sequences > 0) {  // the last sequence ends where the .bin does
        ZR_ASSIGN_OR_RETURN(const std::string size,
                            ReadAt(*idx, idx_path, kMegatronHeader + (sequences - 1) * 4, 4));
        ZR_ASSIGN_OR_RETURN(
            const std::string pointer,
            ReadAt(*idx, idx_path, kMegatronHeader + sequences * 4 + (sequences - 1) * 8, 8));
        const uint64_t last_size =
            LittleEndian(reinterpret_cast<const unsigned char*>(size.data()), 4);
        const uint64_t last_pointer =
            LittleEndian(reinterpret_cast<const unsigned char*>(pointer.data()), 8);
        if (last_pointer > file->size || last_size > (file->size - last_pointer) / dtype.width ||
            last_pointer + last_size * dtype.width != file->size) {
          return absl::InvalidArgumentError(
              StrCat(idx_path, ": its last sequence (", last_size, " tokens at byte ", last_pointer,
                     ") does not end where ", data_path, " does (", file->size, " bytes)"));
        }
      }
    } else {
      return absl::InvalidArgumentError(StrCat(
          data_path,
          ": not a token file zerort knows (no zerort, llm.c or Megatron header); for a raw "
          "array of tokens (nanoGPT's train.bin) set data.format to uint16 or uint32, or make one "
          "with `zerort data prepare TEXT_FILE OUT`"));
    }
    if (s->format_ != "megatron") {
      const uint64_t payload = file->size - header;
      if (count > payload / s->width_ || payload != count * s->width_) {
        return absl::InvalidArgumentError(StrCat(data_path, ": header says ", count, " tokens of ",
                                                 s->width_, " bytes, but the file holds ", payload,
                                                 " bytes after it"));
      }
    }
  }
  s->count_ = static_cast<int64_t>(count);
  if (file->size > 0) {
    void* map = mmap(nullptr, file->size, PROT_READ, MAP_SHARED, file->fd, 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      return ErrnoError(StrCat("mmap ", data_path), err);
    }
    madvise(map, file->size, MADV_RANDOM);  // windows, not a scan: no readahead of the rest
    s->map_ = map;
    s->map_bytes_ = file->size;
    s->data_ = static_cast<const unsigned char*>(map) + header;
  }
  if (data_path != path) s->name_ = StrCat(path, " (", data_path, ")");
  return s;
}

Status TokenSource::Read(int64_t offset, std::span<int32_t> out, int vocab) const {
  const int64_t n = static_cast<int64_t>(out.size());
  ZR_CHECK(offset >= 0 && n <= count_ - offset)
      << "tokens [" << offset << ", " << offset + n << ") of " << count_ << " in " << name_;
  for (int64_t i = 0; i < n; ++i) {
    int64_t t;
    if (data_ == nullptr) {
      t = memory_[offset + i];
    } else {
      const unsigned char* p = data_ + (offset + i) * width_;
      const uint64_t raw = LittleEndian(p, width_);
      t = static_cast<int64_t>(raw);
      if (is_signed_ && width_ < 8 && (raw >> (8 * width_ - 1)) != 0) {
        t = static_cast<int64_t>(raw) - (int64_t{1} << (8 * width_));
      }
    }
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(StrCat(name_, ": token ", offset + i, " = ", t,
                                               " is outside the vocabulary [0, ", vocab, ")"));
    }
    out[i] = static_cast<int32_t>(t);
  }
  return absl::OkStatus();
}

}  // namespace zerort
