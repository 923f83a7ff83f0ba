// Packaging as an operator installs it: `cmake --install` lays out binaries, unit files,
// default config and docs; cpack builds a .deb that, unpacked into a temporary root, runs.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "kvtier_version.h"
#include "tests/integration/engine_process.h"

namespace kvtier::testing {
namespace {

const std::string kBuild = std::filesystem::path(KVTIER_TESTS_DIR).parent_path().string();

bool Exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

const char* const kLayout[] = {
    "/usr/bin/kvtierd",
    "/usr/bin/kvctl",
    "/usr/libexec/kvtier/kvtier-replay",
    "/usr/libexec/kvtier/kvtier-sim",
    "/usr/libexec/kvtier/kvtier-load",
    "/usr/include/kvtier/engine/client.h",
    "/usr/include/kvtier/engine/kvtier.h",
    "/usr/lib/systemd/system/kvtierd.service",
    "/usr/lib/sysusers.d/kvtier.conf",
    "/usr/lib/tmpfiles.d/kvtier.conf",
    "/etc/kvtier/kvtierd.yaml",
    "/usr/share/doc/kvtier/operations.md",
    "/usr/share/doc/kvtier/monitoring/alerts.yml",
    "/usr/share/doc/kvtier/monitoring/grafana-kvtier.json",
};

// The Python package, where this build has one (not in sanitizer builds).
const std::vector<std::string> kPythonLayout =
    KVTIER_HAVE_PYTHON ? std::vector<std::string>{"/usr/lib/python3/dist-packages/kvtier/__init__.py",
                                                  "/usr/lib/python3/dist-packages/kvtier/vllm/__init__.py",
                                                  "/usr/lib/python3/dist-packages/kvtier/sglang/__init__.py"}
                       : std::vector<std::string>{};

// The layout above is the packaged one, with the project's default prefix /usr.
#define KVTIER_SKIP_UNLESS_PREFIX_USR()                                                         \
  if (std::string(KVTIER_INSTALL_PREFIX) != "/usr") {                                           \
    GTEST_SKIP() << "configured with CMAKE_INSTALL_PREFIX=" KVTIER_INSTALL_PREFIX ", not /usr"; \
  }

TEST(Packaging, CmakeInstallLaysOutBinariesUnitConfigAndDocs) {
  KVTIER_SKIP_UNLESS_PREFIX_USR();
  TempDir root;
  CmdResult r = Sh("DESTDIR=" + root.path() + " cmake --install " + kBuild);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* f : kLayout) EXPECT_TRUE(Exists(root.path() + f)) << f;
  for (const std::string& f : kPythonLayout) EXPECT_TRUE(Exists(root.path() + f)) << f;
  CmdResult v = Sh(root.path() + "/usr/bin/kvtierd --version");
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_NE(v.out.find("kvtierd 0."), std::string::npos) << v.out;
  // The shipped config is one kvtierd accepts.
  CmdResult c =
      Sh(root.path() + "/usr/bin/kvtierd --check-config --config " + root.path() + "/etc/kvtier/kvtierd.yaml");
  EXPECT_EQ(c.code, 0) << c.out;
}

TEST(Packaging, TheDebInstallsIntoATemporaryRootAndRuns) {
  KVTIER_SKIP_UNLESS_PREFIX_USR();
  TempDir out, root;
  CmdResult p = Sh("cd " + kBuild + " && cpack -G DEB -B " + out.path());
  ASSERT_EQ(p.code, 0) << p.out;
  const std::string deb = out.path() + "/kvtier_" + std::string(kVersion) + "_amd64.deb";
  ASSERT_TRUE(Exists(deb)) << p.out;
  CmdResult info = Sh("dpkg-deb -f " + deb + " Package Depends");
  EXPECT_NE(info.out.find("Package: kvtier"), std::string::npos) << info.out;
  for (const char* dep : {"librocksdb", "liburing", "libyaml-cpp", "libsystemd0"}) {
    EXPECT_NE(info.out.find(dep), std::string::npos) << dep << " missing from Depends: " << info.out;
  }
  CmdResult conf = Sh("dpkg-deb --ctrl-tarfile " + deb + " | tar -xO ./conffiles");
  EXPECT_NE(conf.out.find("/etc/kvtier/kvtierd.yaml"), std::string::npos) << "the config must survive upgrades";
  CmdResult post = Sh("dpkg-deb --ctrl-tarfile " + deb + " | tar -xO ./postinst");
  EXPECT_NE(post.out.find("systemd-sysusers kvtier.conf"), std::string::npos) << post.out;
  // dpkg --root would also run maintainer scripts against that root; unpacking is the same
  // file layout without needing a dpkg database there.
  CmdResult x = Sh("dpkg-deb -x " + deb + " " + root.path());
  ASSERT_EQ(x.code, 0) << x.out;
  for (const char* f : kLayout) EXPECT_TRUE(Exists(root.path() + f)) << f;
  for (const std::string& f : kPythonLayout) EXPECT_TRUE(Exists(root.path() + f)) << f;
  CmdResult v = Sh(root.path() + "/usr/bin/kvtierd --version");
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_NE(v.out.find("kvtierd " + std::string(kVersion)), std::string::npos) << v.out;
  EXPECT_EQ(Sh(root.path() + "/usr/bin/kvctl --help").code, 0);
  if (!kPythonLayout.empty()) {
    // The packaged Python module imports from the packaged files alone; its vLLM connector
    // and SGLang backend import too, but need their engine (not in Debian's Python) to be
    // made, and say so.
    CmdResult py = Sh("PYTHONPATH=" + root.path() +
                      "/usr/lib/python3/dist-packages /usr/bin/python3 -c "
                      "'import kvtier, kvtier.sglang; print(kvtier.__file__)\n"
                      "from kvtier.vllm import KvtierConnector\n"
                      "try:\n    KvtierConnector(None, None)\nexcept ImportError as e:\n    print(e)\n"
                      "from kvtier.sglang import KvtierHiCacheStorage\n"
                      "try:\n    KvtierHiCacheStorage(None, {})\nexcept ImportError as e:\n    print(e)'");
    EXPECT_EQ(py.code, 0) << py.out;
    EXPECT_NE(py.out.find(root.path()), std::string::npos) << py.out;
    EXPECT_NE(py.out.find("kvtier.vllm is vLLM's KV connector and needs vLLM installed"), std::string::npos) << py.out;
    EXPECT_NE(py.out.find("kvtier.sglang is SGLang's HiCache storage backend and needs SGLang installed"),
              std::string::npos)
        << py.out;
  }
}

}  // namespace
}  // namespace kvtier::testing

namespace kvtier::testing {
namespace {

// An engine as its developers would build one against an installed kvtier: a few lines of
// CMake (find_package) or one pkg-config line, then a session that stores and finds a block,
// and the daemon's stats through the control client (an operator's tool).
constexpr const char* kConsumerMain = R"(#include <cstdio>
#include <cstring>
#include "engine/client.h"
#include "engine/control_client.h"
int main(int argc, char** argv) {
  kvtier::ClientOptions o;
  o.socket_path = argv[1];
  o.engine_name = "out-of-tree";
  o.layout.model_id = "consumer-model";
  o.layout.num_layers = 2; o.layout.kv_heads = 2; o.layout.head_dim = 64;
  o.layout.dtype = kvtier::DType::kBFloat16; o.layout.tokens_per_block = 16;
  o.layout.block_bytes = o.layout.NaturalBlockBytes();
  auto c = kvtier::Client::Connect(o);
  if (!c.ok()) { std::printf("connect: %s\n", c.status().ToString().c_str()); return 1; }
  auto pages = (*c)->Allocate(kvtier::TierKind::kHost, 1);
  if (!pages.ok()) return 2;
  std::memset((*c)->PageBytes(kvtier::TierKind::kHost, (*pages)[0]).data(), 7, 64);
  const uint8_t raw[16] = {1, 2, 3};
  kvtier::BlockHash h(std::span<const uint8_t>(raw, 16));
  kvtier::CommitEntry e{(*pages)[0], h, {}};
  if (!(*c)->Commit(kvtier::TierKind::kHost, {&e, 1}).ok()) return 3;
  auto l = (*c)->Lookup({&h, 1});
  if (!l.ok() || l->matched != 1) return 4;
  // An operator's tool beside it: the control client's header compiles from the install too.
  kvtier::ControlClientOptions co;
  co.socket_path = argv[1];
  auto ctl = kvtier::ControlClient::Connect(co);
  if (!ctl.ok()) return 5;
  auto stats = (*ctl)->Stats();
  if (!stats.ok() || stats->tiers.empty()) return 6;
  std::printf("out-of-tree engine: stored and found 1 block\n");
  return 0;
}
)";

TEST(Packaging, AnOutOfTreeEngineLinksTheInstalledClientAndTalksToADaemon) {
  TempDir prefix, project;
  CmdResult inst =
      Sh("cmake --install " + kBuild + " --prefix " + prefix.path() + " --component dev && cmake --install " + kBuild +
         " --prefix " + prefix.path() + " --component runtime");
  ASSERT_EQ(inst.code, 0) << inst.out;
  std::ofstream(project.File("main.cc")) << kConsumerMain;
  std::ofstream(project.File("CMakeLists.txt")) << "cmake_minimum_required(VERSION 3.25)\n"
                                                   "project(consumer CXX)\n"
                                                   "find_package(kvtier 0.1 REQUIRED)\n"
                                                   "add_executable(consumer main.cc)\n"
                                                   "target_link_libraries(consumer PRIVATE kvtier::client)\n";
  const std::string flags = KVTIER_CONSUMER_FLAGS;  // a sanitizer build's library needs them in its users
  CmdResult build = Sh("cmake -S " + project.path() + " -B " + project.File("build") +
                       " -DCMAKE_PREFIX_PATH=" + prefix.path() + " '-DCMAKE_CXX_FLAGS=" + flags +
                       "' '-DCMAKE_EXE_LINKER_FLAGS=" + flags + "' && cmake --build " + project.File("build"));
  ASSERT_EQ(build.code, 0) << build.out;
  // The same program with pkg-config and a plain compiler line.
  CmdResult pc = Sh("PKG_CONFIG_PATH=$(dirname $(find " + prefix.path() + " -name kvtier.pc)) sh -c 'g++ -std=c++20 " +
                    project.File("main.cc") + " -o " + project.File("consumer-pc") + " " + flags +
                    " $(pkg-config --cflags --libs kvtier)'");
  ASSERT_EQ(pc.code, 0) << pc.out;
  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  CmdResult run = Sh(project.File("build/consumer") + " " + d.socket_path());
  EXPECT_EQ(run.code, 0) << run.out;
  EXPECT_NE(run.out.find("stored and found 1 block"), std::string::npos) << run.out;
  const std::string libdir = Sh("dirname $(find " + prefix.path() + " -name 'libkvtier.so.0')").out;
  CmdResult run_pc = Sh("LD_LIBRARY_PATH=" + libdir.substr(0, libdir.find('\n')) + " " + project.File("consumer-pc") +
                        " " + d.socket_path());
  EXPECT_EQ(run_pc.code, 0) << run_pc.out;
  // What an engine links pulls in no storage code and no test patterns.
  CmdResult syms = Sh("nm -DC --defined-only $(find " + prefix.path() +
                      " -name 'libkvtier.so.0') | grep -c -E "
                      "'kvtier::(NvmeTier|TierPool|FillBlockPattern|CacheManager|RocksDb)' || true");
  EXPECT_EQ(syms.out.substr(0, syms.out.find('\n')), "0") << syms.out;
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

}  // namespace
}  // namespace kvtier::testing
