// Replays fuzz inputs through a fuzz target without libFuzzer: the regression half of fuzzing.
// Built with the normal toolchain into tessera_fuzz_replay_<target> and run by ctest over the
// target's seed corpus (tests/fuzz/corpus/<target>) and its past findings
// (tests/fuzz/regressions/<target>): each input must come back (a tessera::Error is fine, the
// target catches it); an escaped exception, a crash or a hang fails the test.
//
//   tessera_fuzz_replay_<target> DIR_OR_FILE...
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const fs::path p(argv[i]);
    if (fs::is_directory(p)) {
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file() && e.path().filename().string()[0] != '.') files.push_back(e.path());
    } else if (fs::is_regular_file(p)) {
      files.push_back(p);
    } else {
      std::fprintf(stderr, "replay: no such file or directory: %s\n", argv[i]);
      return 2;
    }
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "replay: %s: escaped exception: %s\n", f.c_str(), e.what());
      return 1;
    }
  }
  std::printf("replay: %zu inputs, all handled\n", files.size());
  return 0;
}
