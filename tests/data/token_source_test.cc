// TokenSource ([Note: the token files zerort reads]): every format read in its stored width to the
// tokens written, and every malformed header refused by name before anything is mapped.
#include "zerort/data/token_source.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "zerort/data/token_file.h"

namespace zerort {
namespace {

void Put(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// A directory of this test's own: a Megatron dataset is found by its sibling .idx, which must not
// meet other tests' files.
std::string Dir() {
  const std::string dir = ::testing::TempDir() + "/token_source_test";
  std::filesystem::create_directories(dir);
  return dir;
}

std::string Write(const std::string& name, const std::string& bytes) {
  const std::string path = Dir() + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return path;
}

std::vector<int32_t> ReadAll(const TokenSource& s, int vocab) {
  std::vector<int32_t> out(static_cast<size_t>(s.size()));
  const Status read = s.Read(0, out, vocab);
  EXPECT_TRUE(read.ok()) << read;
  return out;
}

const std::vector<int32_t> kTokens = {0, 1, 300, 50256, 7, 65535, 2, 9};

std::string Llmc(int version, const std::vector<int32_t>& tokens, int64_t count = -1) {
  std::string out;
  Put(out, 20240520, 4);
  Put(out, version, 4);
  Put(out, count >= 0 ? count : tokens.size(), 4);
  out.resize(1024, '\0');
  for (int32_t t : tokens) Put(out, t, version == 1 ? 2 : 4);
  return out;
}

// A Megatron index for `sizes` (sequences back to back) of tokens of `width` bytes, dtype `code`.
std::string MegatronIdx(int code, int width, const std::vector<int64_t>& sizes,
                        uint64_t version = 1) {
  std::string out("MMIDIDX\0\0", 9);
  Put(out, version, 8);
  Put(out, code, 1);
  Put(out, sizes.size(), 8);
  Put(out, sizes.size() + 1, 8);  // documents: one per sequence, plus the leading 0
  for (int64_t n : sizes) Put(out, n, 4);
  int64_t at = 0;
  for (int64_t n : sizes) {
    Put(out, at, 8);
    at += n * width;
  }
  for (size_t d = 0; d <= sizes.size(); ++d) Put(out, d, 8);
  return out;
}

std::string Raw(const std::vector<int32_t>& tokens, int width) {
  std::string out;
  for (int32_t t : tokens) Put(out, t, width);
  return out;
}

TEST(TokenSourceTest, EveryFormatReadsTheTokensWritten) {
  // zerort's own, at each width.
  const std::string zr = Dir() + "/tokens.zr";
  ASSERT_TRUE(WriteTokenFile(zr, kTokens, 70000).ok());
  auto s = *TokenSource::Open(zr, TokenFormat::kDetect);
  EXPECT_EQ(s->format_name(), "zerort");
  EXPECT_EQ(s->width(), 4);
  EXPECT_EQ(s->vocab_size(), 70000);
  EXPECT_EQ(ReadAll(*s, 70000), kTokens);

  // llm.c shards: version 1 (uint16), version 2 (uint32).
  for (int version : {1, 2}) {
    s = *TokenSource::Open(Write("shard.bin", Llmc(version, kTokens)), TokenFormat::kDetect);
    EXPECT_EQ(s->format_name(), "llm.c");
    EXPECT_EQ(s->width(), version == 1 ? 2 : 4);
    EXPECT_EQ(s->vocab_size(), 0);  // not recorded
    EXPECT_EQ(ReadAll(*s, 65536), kTokens);
  }

  // Megatron: uint16 and int32, named by prefix, .idx or .bin.
  for (auto [code, width] : {std::pair{8, 2}, std::pair{4, 4}}) {
    Write("mega.idx", MegatronIdx(code, width, {3, 5}));
    Write("mega.bin", Raw(kTokens, width));
    const std::string prefix = Dir() + "/mega";
    for (const std::string& name : {prefix, prefix + ".idx", prefix + ".bin"}) {
      s = *TokenSource::Open(name, TokenFormat::kDetect);
      EXPECT_EQ(s->format_name(), "megatron") << name;
      EXPECT_EQ(s->width(), width);
      EXPECT_EQ(ReadAll(*s, 65536), kTokens) << name;
    }
  }

  // Raw arrays, only when told.
  for (auto [format, width] :
       {std::pair{TokenFormat::kUint16, 2}, std::pair{TokenFormat::kUint32, 4}}) {
    s = *TokenSource::Open(Write("train.bin", Raw(kTokens, width)), format);
    EXPECT_EQ(s->width(), width);
    EXPECT_EQ(ReadAll(*s, 65536), kTokens);
    const Status refused =
        TokenSource::Open(Write("train.bin", Raw(kTokens, width)), TokenFormat::kDetect).status();
    EXPECT_NE(refused.message().find("set data.format to uint16 or uint32"), std::string::npos)
        << refused;
  }

  // A window in the middle, in the stored width.
  s = *TokenSource::Open(Write("shard.bin", Llmc(1, kTokens)), TokenFormat::kDetect);
  std::vector<int32_t> window(3);
  ASSERT_TRUE(s->Read(2, window, 65536).ok());
  EXPECT_EQ(window, (std::vector<int32_t>{300, 50256, 7}));
  // A token outside the vocabulary: named by file and index, when its window is read.
  const Status beyond = s->Read(2, window, 50000);
  EXPECT_NE(beyond.message().find("token 3 = 50256 is outside the vocabulary [0, 50000)"),
            std::string::npos)
      << beyond;
  EXPECT_NE(beyond.message().find("shard.bin"), std::string::npos) << beyond;
}

TEST(TokenSourceTest, MalformedHeadersAreRefusedByName) {
  auto refused = [](const std::string& path, const char* needle,
                    TokenFormat format = TokenFormat::kDetect) {
    const Status s = TokenSource::Open(path, format).status();
    EXPECT_FALSE(s.ok()) << path;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s;
    EXPECT_NE(s.message().find(::testing::TempDir()), std::string::npos) << "names the file: " << s;
  };
  refused(Write("short.bin", Llmc(1, {}).substr(0, 100)), "shorter than the 1024-byte");
  refused(Write("v3.bin", Llmc(3, kTokens)), "llm.c token shard version 3");
  // A count that disagrees with the size, and one whose byte size overflows 64 bits.
  refused(Write("count.bin", Llmc(1, kTokens, 9)), "header says 9 tokens");
  std::string huge = Llmc(2, kTokens);
  huge[8] = huge[9] = huge[10] = huge[11] = '\xff';
  refused(Write("huge.bin", huge), "header says 4294967295 tokens");
  refused(Write("odd.bin", Raw(kTokens, 2) + "x"), "not a whole number of uint16",
          TokenFormat::kUint16);
  refused(Dir(), "not a regular file");
  refused(Dir() + "/absent.bin", "open token file");

  // Megatron: magic, version, dtype, counts beyond the index, a .bin that ends elsewhere.
  const std::string prefix = Dir() + "/bad";
  Write("bad.bin", Raw(kTokens, 2));
  std::string idx = MegatronIdx(8, 2, {3, 5});
  idx[0] = 'X';
  Write("bad.idx", idx);
  refused(prefix, "no MMIDIDX magic");
  Write("bad.idx", MegatronIdx(8, 2, {3, 5}, 2));
  refused(prefix, "Megatron index version 2");
  Write("bad.idx", MegatronIdx(6, 8, {3, 5}));
  refused(prefix, "dtype code 6 is not an integer token type");
  idx = MegatronIdx(8, 2, {3, 5});
  for (int i = 18; i < 26; ++i) idx[i] = '\x7f';  // 2^63-ish sequences
  Write("bad.idx", idx);
  refused(prefix, "do not fit its");
  Write("bad.idx", MegatronIdx(8, 2, {3, 6}));
  refused(prefix, "does not end where");
}

}  // namespace
}  // namespace zerort
