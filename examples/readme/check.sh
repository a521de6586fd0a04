#!/bin/sh
# make test-install's doc test: the C++ block of README.md between the readme-example markers,
# built against the installed package and run alone, then resumed from its checkpoint under
# mpirun -np 2 (which finds step 300 and takes no step), then trained fresh under mpirun -np 2.
#   check.sh README PREFIX SCRATCH MPIRUN...
set -eu
readme=$1 prefix=$2 scratch=$3
shift 3
rm -rf "$scratch" && mkdir -p "$scratch"
sed -n '/<!-- readme-example: begin -->/,/<!-- readme-example: end -->/p' "$readme" |
  sed '/^<!--/d; /^```/d' > "$scratch/main.cc"
test -s "$scratch/main.cc"
# The target README.md's CMake block links, which docs/embedding.md must name too.
target=$(sed -n 's/^target_link_libraries(my_trainer PRIVATE \(zerort::[a-z]*\).*/\1/p' "$readme")
test -n "$target" || { echo "readme check: README.md names no zerort target" >&2; exit 1; }
grep -q "links \`$target\`" "$(dirname "$readme")/docs/embedding.md" || {
  echo "readme check: docs/embedding.md does not say it links \`$target\` as README.md does" >&2
  exit 1
}
cat > "$scratch/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(readme_example LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(zerort REQUIRED)
add_executable(readme_example main.cc)
target_link_libraries(readme_example PRIVATE $target)
CMAKE
cmake -S "$scratch" -B "$scratch/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" > /dev/null
cmake --build "$scratch/build" > /dev/null
cd "$scratch"
./build/readme_example
test -d readme-ckpt/step_300
"$@" -np 2 ./build/readme_example
rm -rf readme-ckpt
"$@" -np 2 ./build/readme_example
echo "readme example: built, trained, resumed, trained at 2 ranks"
