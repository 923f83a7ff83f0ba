// Writes the fuzz seed corpus: tests/fuzz/corpus/{frame,dispatcher}/NAME, valid request
// streams from seed_frames.cc (the dispatcher seeds start with a 0 byte: no canned Hello,
// the stream has its own), and tests/fuzz/corpus/{redis_reply,events,config}/NAME from
// seed_inputs.cc. Usage: kvtier-fuzz-corpus DIR
//
// DIR must not look like a flag: `kvtier-fuzz-corpus --help` prints the usage and writes
// nothing (it once created a directory named "--help" in the checkout).
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tests/fuzz/seed_frames.h"
#include "tests/fuzz/seed_inputs.h"

int main(int argc, char** argv) {
  const bool help = argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0);
  if (argc != 2 || help || argv[1][0] == '-' || argv[1][0] == '\0') {
    std::fprintf(help ? stdout : stderr,
                 "usage: %s CORPUS_DIR\n"
                 "Writes the seed corpus of every fuzz target into CORPUS_DIR/TARGET.\n"
                 "CORPUS_DIR may not begin with '-' (write ./-name for such a directory).\n",
                 argv[0]);
    return help ? 0 : 2;
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
  for (const std::string& target : kvtier::fuzz::InputTargets()) {
    std::filesystem::create_directories(dir / target);
    for (const auto& [name, bytes] : kvtier::fuzz::SeedInputs(target)) {
      std::ofstream((dir / target / name), std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
  }
  return 0;
}
