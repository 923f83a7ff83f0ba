// Packaging as an operator installs it: `cmake --install` lays out binaries, unit files,
// default config and docs; cpack builds a .deb that, unpacked into a temporary root, runs.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

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
    "/usr/bin/kvtierd", "/usr/bin/kvctl", "/usr/bin/kvtier-replay", "/usr/bin/kvtier-sim",
    "/usr/lib/systemd/system/kvtierd.service", "/usr/lib/sysusers.d/kvtier.conf",
    "/usr/lib/tmpfiles.d/kvtier.conf", "/etc/kvtier/kvtierd.yaml", "/usr/share/doc/kvtier/operations.md",
    "/usr/share/doc/kvtier/monitoring/alerts.yml", "/usr/share/doc/kvtier/monitoring/grafana-kvtier.json",
};

// The layout above is the packaged one, with the project's default prefix /usr.
#define KVTIER_SKIP_UNLESS_PREFIX_USR()                                                   \
  if (std::string(KVTIER_INSTALL_PREFIX) != "/usr") {                                     \
    GTEST_SKIP() << "configured with CMAKE_INSTALL_PREFIX=" KVTIER_INSTALL_PREFIX ", not /usr"; \
  }

TEST(Packaging, CmakeInstallLaysOutBinariesUnitConfigAndDocs) {
  KVTIER_SKIP_UNLESS_PREFIX_USR();
  TempDir root;
  CmdResult r = Sh("DESTDIR=" + root.path() + " cmake --install " + kBuild);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* f : kLayout) EXPECT_TRUE(Exists(root.path() + f)) << f;
  CmdResult v = Sh(root.path() + "/usr/bin/kvtierd --version");
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_NE(v.out.find("kvtierd 0."), std::string::npos) << v.out;
  // The shipped config is one kvtierd accepts.
  CmdResult c = Sh(root.path() + "/usr/bin/kvtierd --check-config --config " + root.path() + "/etc/kvtier/kvtierd.yaml");
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
  CmdResult v = Sh(root.path() + "/usr/bin/kvtierd --version");
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_NE(v.out.find("kvtierd " + std::string(kVersion)), std::string::npos) << v.out;
  EXPECT_EQ(Sh(root.path() + "/usr/bin/kvctl --help").code, 0);
}

}  // namespace
}  // namespace kvtier::testing
