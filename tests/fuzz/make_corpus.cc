// Writes the fuzz seed corpus: tests/fuzz/corpus/{frame,dispatcher}/NAME, valid request
// streams from seed_frames.cc. The dispatcher seeds start with a 0 byte (no canned Hello:
// the stream has its own). Usage: kvtier-fuzz-corpus DIR
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tests/fuzz/seed_frames.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  for (const char* target : {"frame", "dispatcher"}) std::filesystem::create_directories(dir / target);
  for (const auto& [name, bytes] : kvtier::fuzz::SeedStreams()) {
    std::ofstream((dir / "frame" / name), std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    std::ofstream d(dir / "dispatcher" / name, std::ios::binary);
    d.put('\0');
    d.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  return 0;
}
