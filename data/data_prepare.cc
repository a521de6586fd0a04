// A text corpus into a token file, streamed and threaded (data_prepare.h).
#include "zerort/data/data_prepare.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "zerort/data/tokenizer.h"
#include "zerort/runtime/json_reader.h"
#include "zerort/runtime/strings.h"
#include "zerort/runtime/user_file.h"

namespace zerort {
namespace {

// The last place in text[0, end) where the text may be cut ([Note: cutting a text], tokenizer.h):
// after a '\n' (JSON lines: documents are encoded one by one), anywhere (byte tokens), or where
// the tokenizer says. nullopt when there is none.
std::optional<TextCut> LastCut(std::string_view text, size_t end, bool lines,
                               const Tokenizer* tokenizer) {
  if (lines) {
    for (size_t i = std::min(end, text.size()); i > 1; --i) {
      if (text[i - 1] == '\n') return TextCut{i, i};
    }
    return std::nullopt;
  }
  if (tokenizer == nullptr)
    return end > 0 ? std::optional<TextCut>(TextCut{end, end}) : std::nullopt;
  return tokenizer->LastCut(text, end);
}

// The token file written as it goes: header first (its count patched at the end), through a
// FileReplacement ([Note: a file written beside its target]).
class TokenWriter {
 public:
  static StatusOr<std::unique_ptr<TokenWriter>> Create(const std::string& path, int vocab) {
    ZR_ASSIGN_OR_RETURN(FileReplacement file, FileReplacement::Begin(path, "data prepare"));
    auto w = std::unique_ptr<TokenWriter>(new TokenWriter(std::move(file), vocab));
    ZR_RETURN_IF_ERROR(w->file_.Write(w->Header(0)));
    return w;
  }
  Status Append(const std::vector<int32_t>& ids) {
    std::string out;
    out.reserve(ids.size() * static_cast<size_t>(width_));
    for (int32_t t : ids) {
      for (int b = 0; b < width_; ++b) out.push_back(static_cast<char>((t >> (8 * b)) & 0xff));
    }
    count_ += static_cast<int64_t>(ids.size());
    return file_.Write(out);
  }
  Status Commit() {
    const std::string header = Header(count_);
    if (::pwrite(file_.fd(), header.data(), header.size(), 0) !=
        static_cast<ssize_t>(header.size())) {
      return ErrnoError(StrCat("write ", file_.temp_path()), errno);
    }
    return file_.Commit();
  }
  int64_t count() const { return count_; }

 private:
  TokenWriter(FileReplacement file, int vocab)
      : file_(std::move(file)),
        vocab_(vocab),
        width_(vocab <= 256     ? 1
               : vocab <= 65536 ? 2
                                : 4) {}
  std::string Header(int64_t count) const {  // token_file.h's format, version 1
    std::string h = "ZRTOKENS";
    auto u32 = [&](uint32_t v) {
      for (int i = 0; i < 4; ++i) h.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    };
    u32(1);
    u32(static_cast<uint32_t>(width_));
    for (int i = 0; i < 8; ++i)
      h.push_back(static_cast<char>((static_cast<uint64_t>(count) >> (8 * i)) & 0xff));
    u32(static_cast<uint32_t>(vocab_));
    u32(0);
    return h;
  }
  FileReplacement file_;
  int vocab_, width_;
  int64_t count_ = 0;
};

}  // namespace

StatusOr<PrepareSummary> PrepareTokenFile(const PrepareOptions& o,
                                          const std::function<void(int64_t, int64_t)>& progress) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<Tokenizer> tokenizer;
  if (!o.tokenizer.empty()) {
    ZR_ASSIGN_OR_RETURN(tokenizer, Tokenizer::Load(o.tokenizer));
  }
  const int fd = ::open(o.input.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoError(StrCat("open ", o.input), errno);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return ErrnoError(StrCat("stat ", o.input), errno);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(StrCat(o.input, ": not a regular file"));
  }
  const int64_t total = st.st_size;
  if (total == 0) return absl::InvalidArgumentError(StrCat(o.input, " is empty"));
  const bool lines = o.input.ends_with(".jsonl");
  const std::optional<int32_t> eos = tokenizer ? tokenizer->EndOfText() : std::nullopt;
  if (tokenizer && !eos) {
    return absl::InvalidArgumentError(
        StrCat(o.tokenizer,
               ": no end-of-text token (<|endoftext|>, <|end_of_text|>, </s>, <eos>) among "
               "its added tokens to put between documents"));
  }
  PrepareSummary summary;
  summary.vocab_size = tokenizer ? tokenizer->vocab_size() : 256;
  ZR_ASSIGN_OR_RETURN(auto writer, TokenWriter::Create(o.output, summary.vocab_size));
  const int threads = o.threads > 0
                          ? o.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  // One piece of text (whole lines, or cut where no pre-token spans) into ids.
  auto encode = [&](std::string_view text, std::vector<int32_t>& ids, int64_t& docs,
                    int64_t offset) -> Status {
    if (!tokenizer) {
      for (char c : text) ids.push_back(static_cast<uint8_t>(c));
      return absl::OkStatus();
    }
    if (const std::optional<size_t> bad = FirstInvalidUtf8(text)) {  // named in the file
      return absl::InvalidArgumentError(
          StrCat(o.input, ": not valid UTF-8 at byte ", offset + static_cast<int64_t>(*bad), " (0x",
                 fmt::format("{:02X}", static_cast<uint8_t>(text[*bad])),
                 "): a tokenizer reads Unicode text"));
    }
    if (!lines) {
      // At most about 1 MiB per call where the tokenizer can be cut: a SentencePiece call's
      // memory grows with its text (about 80 bytes a character).
      constexpr size_t kCall = size_t{1} << 20;
      while (text.size() > kCall) {
        const std::optional<TextCut> c = tokenizer->LastCut(text, kCall);
        if (!c || c->first_end == 0) break;
        ZR_RETURN_IF_ERROR(tokenizer->Encode(text.substr(0, c->first_end), ids));
        text.remove_prefix(c->second_begin);
      }
      return tokenizer->Encode(text, ids);
    }
    size_t at = 0;
    while (at < text.size()) {
      size_t end = text.find('\n', at);
      if (end == std::string_view::npos) end = text.size();
      const std::string_view line = text.substr(at, end - at);
      if (!line.empty() && line.find_first_not_of(" \t\r") != std::string_view::npos) {
        JsonLimits limits;
        limits.max_string = size_t{1} << 30;
        limits.max_bytes = int64_t{1} << 30;
        const std::string where = StrCat(o.input, " at byte ", offset + static_cast<int64_t>(at));
        ZR_ASSIGN_OR_RETURN(const nlohmann::json j, ParseJsonText(line, where, limits));
        if (!j.contains("text") || !j.at("text").is_string()) {
          return absl::InvalidArgumentError(StrCat(where, ": a line without a \"text\" string"));
        }
        ZR_RETURN_IF_ERROR(tokenizer->Encode(j.at("text").get<std::string>(), ids));
        ids.push_back(*eos);
        ++docs;
      }
      at = end + 1;
    }
    return absl::OkStatus();
  };
  std::string buffer;
  int64_t offset = 0;  // of buffer[0] in the input
  int64_t read_total = 0;
  int64_t want = o.block_bytes;  // grows while a block holds no cut
  bool eof = false;
  while (!eof || !buffer.empty()) {
    while (!eof && static_cast<int64_t>(buffer.size()) < want) {
      const size_t old = buffer.size();
      const size_t n_want = static_cast<size_t>(want) - old;
      buffer.resize(old + n_want);
      const ssize_t n = ::read(fd, buffer.data() + old, n_want);
      if (n < 0 && errno == EINTR) {
        buffer.resize(old);
        continue;
      }
      if (n < 0) return ErrnoError(StrCat("read ", o.input), errno);
      buffer.resize(old + static_cast<size_t>(n));
      read_total += n;
      if (n == 0) eof = true;
    }
    // The block to encode now, up to the buffer's last cut (the whole buffer at the end).
    std::optional<TextCut> cut = eof ? TextCut{buffer.size(), buffer.size()}
                                     : LastCut(buffer, buffer.size(), lines, tokenizer.get());
    if (cut && cut->first_end == 0) cut.reset();
    if (!cut) {
      if (buffer.size() > (size_t{1} << 30)) {
        return absl::InvalidArgumentError(
            StrCat(o.input, ": no place to cut in 1 GiB from byte ", offset,
                   lines ? " (a JSON line of more than 1 GiB)"
                         : " (this tokenizer cuts a plain text only where its ids cannot change: "
                           "[Note: cutting a text] in data/tokenizer.h; give a .jsonl file of "
                           "documents, one per line)"));
      }
      want += o.block_bytes;
      continue;
    }
    want = o.block_bytes;
    // One piece per thread, each ending at a cut: [begins[p], ends[p]).
    const std::string_view block(buffer.data(), cut->first_end);
    std::vector<size_t> begins = {0}, ends;
    for (int t = 1; t < threads; ++t) {
      const size_t share = block.size() * static_cast<size_t>(t) / static_cast<size_t>(threads);
      const std::optional<TextCut> c = LastCut(block, share, lines, tokenizer.get());
      if (c && c->first_end > begins.back()) {
        ends.push_back(c->first_end);
        begins.push_back(c->second_begin);
      }
    }
    ends.push_back(block.size());
    std::vector<std::vector<int32_t>> ids(ends.size());
    std::vector<Status> status(ends.size());
    std::vector<int64_t> docs(ends.size(), 0);
    std::vector<std::thread> pool;
    for (size_t p = 0; p < ends.size(); ++p) {
      const size_t begin = begins[p];
      pool.emplace_back([&, p, begin] {
        status[p] = encode(block.substr(begin, ends[p] - begin), ids[p], docs[p],
                           offset + static_cast<int64_t>(begin));
      });
    }
    for (std::thread& t : pool) t.join();
    for (size_t p = 0; p < ends.size(); ++p) {
      if (!status[p].ok()) {  // named by the file (a JSON line's message already is)
        if (absl::StartsWith(status[p].message(), o.input)) return status[p];
        return absl::Status(status[p].code(), StrCat(o.input, " (the block from byte ",
                                                     offset + static_cast<int64_t>(begins[p]),
                                                     "): ", status[p].message()));
      }
      ZR_RETURN_IF_ERROR(writer->Append(ids[p]));
      summary.documents += docs[p];
    }
    buffer.erase(0, cut->second_begin);
    offset += static_cast<int64_t>(cut->second_begin);
    if (progress) progress(offset, total);
  }
  if (!lines) {
    summary.documents = 1;
    if (eos) ZR_RETURN_IF_ERROR(writer->Append({*eos}));
  }
  summary.tokens = writer->count();
  if (summary.tokens == 0) return absl::InvalidArgumentError(StrCat(o.input, " holds no text"));
  ZR_RETURN_IF_ERROR(writer->Commit());
  summary.bytes = read_total;
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace zerort
