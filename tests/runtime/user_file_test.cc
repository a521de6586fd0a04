// FileReplacement and WriteFileAtomically: a target replaced whole or not at all, and nothing
// beside it touched ([Note: a file written beside its target] in runtime/user_file.h).
#include "zerort/runtime/user_file.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace zerort {
namespace {

namespace fs = std::filesystem;

class UserFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zr_user_file_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  static void Put(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
  }
  static std::string Get(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  std::set<std::string> Names() const {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.insert(e.path().filename().string());
    return out;
  }
  fs::path dir_;
};

TEST_F(UserFileTest, TheUsersFileBesideTheTargetIsNeverTouched) {
  Put(Path("out.bin"), "old");
  Put(Path("out.bin.tmp"), "the user's");
  ASSERT_TRUE(WriteFileAtomically(Path("out.bin"), "new", "test").ok());
  EXPECT_EQ(Get(Path("out.bin")), "new");
  EXPECT_EQ(Get(Path("out.bin.tmp")), "the user's");
  EXPECT_EQ(Names(), (std::set<std::string>{"out.bin", "out.bin.tmp"}));
}

TEST_F(UserFileTest, AReplacementNotCommittedLeavesTheTargetAndNothingElse) {
  Put(Path("out.bin"), "old");
  {
    StatusOr<FileReplacement> r = FileReplacement::Begin(Path("out.bin"), "test");
    ASSERT_TRUE(r.ok()) << r.status();
    const std::string temp = r->temp_path();
    EXPECT_TRUE(temp.starts_with(Path("out.bin.zerort-")) && temp.ends_with(".tmp")) << temp;
    ASSERT_TRUE(r->Write("half of it").ok());
    EXPECT_TRUE(fs::exists(temp));
    FileReplacement moved = std::move(*r);  // the moved-from one removes nothing
  }
  EXPECT_EQ(Get(Path("out.bin")), "old");
  EXPECT_EQ(Names(), std::set<std::string>{"out.bin"});
}

TEST_F(UserFileTest, TwoWritersOfOneTargetNeverShareAFile) {
  StatusOr<FileReplacement> a = FileReplacement::Begin(Path("out.bin"), "test");
  StatusOr<FileReplacement> b = FileReplacement::Begin(Path("out.bin"), "test");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->temp_path(), b->temp_path());
  ASSERT_TRUE(a->Write("first").ok());
  ASSERT_TRUE(b->Write("second").ok());
  ASSERT_TRUE(a->Commit().ok());
  EXPECT_EQ(Get(Path("out.bin")), "first");
  ASSERT_TRUE(b->Commit().ok());
  EXPECT_EQ(Get(Path("out.bin")), "second");
  EXPECT_EQ(Names(), std::set<std::string>{"out.bin"});
  EXPECT_FALSE(b->Commit().ok());  // once only
  EXPECT_FALSE(b->Write("more").ok());
}

TEST_F(UserFileTest, ADirectoryIsNeverReplacedAndNothingIsMadeBesideIt) {
  fs::create_directories(Path("a_dir"));
  const Status s = WriteFileAtomically(Path("a_dir"), "text", "the test's output");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("the test's output: " + Path("a_dir")), std::string::npos) << s;
  EXPECT_EQ(Names(), std::set<std::string>{"a_dir"});
  EXPECT_TRUE(fs::is_directory(Path("a_dir")));
}

TEST_F(UserFileTest, ADirectoryThatTakesNoNewFileIsAnErrorNamingIt) {
  const Status s = WriteFileAtomically(Path("no_such_dir/out.bin"), "text", "test");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(Path("no_such_dir/out.bin.zerort-")), std::string::npos) << s;
}

}  // namespace
}  // namespace zerort
