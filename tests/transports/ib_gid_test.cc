// The RoCE GID choice (transports/net/ib_gid.h) without a device: tables written out as
// rxe's looks in the rxe VM's suite (a link-local GID, then 10.77.0.1, 10.78.0.1 and
// fd77::1), each GID of RoCE v1 then v2 (rxe itself makes v2 ones only), and the knobs'
// parsing. IbVerbs.GidChoiceAsNcclAsks checks the choice against rxe itself.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "base/error.h"
#include "transports/net/ib_gid.h"

namespace loomtest {
namespace {

using loom::Code;

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

template <typename Fn>
std::string errorOf(Fn fn, Code* code = nullptr) {
  try {
    fn();
  } catch (const loom::Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "";
}

std::vector<loom::ibnet::GidEntry> rxeLikeTable() {
  std::vector<loom::ibnet::GidEntry> t;
  int i = 0;
  for (const char* a : {"fe80::5054:ff:fe12:3456", "::ffff:10.77.0.1", "::ffff:10.78.0.1", "fd77::1"})
    for (int v : {1, 2}) {
      loom::ibnet::GidEntry e{i++, {}, v};
      EXPECT_EQ(inet_pton(AF_INET6, a, e.raw.data()), 1) << a;
      t.push_back(e);
    }
  return t;
}

int choose(const std::vector<loom::ibnet::GidEntry>& t, const char* family, const char* range, int version,
           std::string* note = nullptr) {
  auto p = loom::ibnet::GidPolicy::parse(family, range, version);
  p.familySet = std::string(family) != "AF_INET";
  return loom::ibnet::chooseGid(t, p, "verbs device test:1", note);
}

TEST(IbGidChoice, FamilyRangeAndVersionAsNccl) {
  auto t = rxeLikeTable();
  std::string note;
  EXPECT_EQ(choose(t, "AF_INET", "", 2, &note), 3) << "the first routable IPv4 GID of RoCE v2";
  EXPECT_EQ(note, "");
  EXPECT_EQ(choose(t, "AF_INET", "", 1), 2);
  EXPECT_EQ(choose(t, "AF_INET6", "", 2), 7) << "link-local GIDs do not route";
  EXPECT_EQ(choose(t, "AF_INET6", "", 1), 6);
  EXPECT_EQ(choose(t, "AF_INET", "10.78.0.0/16", 2), 5);
  EXPECT_EQ(choose(t, "AF_INET", "10.78.0.0/16", 1), 4);
  EXPECT_EQ(choose(t, "AF_INET", "10.77.0.1/32", 2), 3);
  EXPECT_EQ(choose(t, "AF_INET", "10.76.0.0/15", 2), 3) << "10.76.0.0/15 holds 10.77, not 10.78";
  EXPECT_EQ(choose(t, "AF_INET", "0.0.0.0/0", 2), 3);
  EXPECT_EQ(choose(t, "AF_INET6", "fd00::/8", 2), 7);
  // The family and version asked for, the version not there: the family wins, as in NCCL.
  std::vector<loom::ibnet::GidEntry> v1only(t.begin(), t.begin() + 3);  // link-local v1, v2; 10.77 v1
  EXPECT_EQ(choose(v1only, "AF_INET", "", 2, &note), 2);
  EXPECT_NE(note.find("is RoCE v2"), std::string::npos) << note;
  // Unreadable types (version 0): the first routable GID of the family, with a note.
  auto untyped = t;
  for (auto& e : untyped) e.roceVersion = 0;
  EXPECT_EQ(choose(untyped, "AF_INET", "", 2, &note), 2);
  EXPECT_NE(note.find("RoCE versions are not known"), std::string::npos) << note;
  EXPECT_EQ(loom::ibnet::describeGids({untyped[2]}), "2: 10.77.0.1 (type unknown)");
}

TEST(IbGidChoice, NoneOfTheFamily) {
  auto t = rxeLikeTable();
  // IPv6 only, defaults: the first valid RoCE v2 GID (Loom's choice before the knobs), noted.
  std::vector<loom::ibnet::GidEntry> v6{t[0], t[1], t[6], t[7]};
  std::string note;
  EXPECT_EQ(choose(v6, "AF_INET", "", 2, &note), 7);
  EXPECT_NE(note.find("no GID has a routable IPv4 address"), std::string::npos) << note;
  // Link-local only: the first set one.
  EXPECT_EQ(choose({t[0], t[1]}, "AF_INET", "", 2, &note), 0);
  EXPECT_NE(note.find("the first set one"), std::string::npos) << note;
  EXPECT_EQ(choose({}, "AF_INET", "", 2), -1);
  // Asked for explicitly and absent: an error listing the GIDs.
  for (auto [family, range] : {std::pair{"AF_INET", "10.99.0.0/16"}, {"AF_INET6", "fe80::/10"}}) {
    Code c{};
    std::string e = errorOf([&] { choose(t, family, range, 2); }, &c);
    EXPECT_EQ(c, Code::kInvalidArgument) << e;
    EXPECT_TRUE(has(e, range) && has(e, "7: fd77::1 (RoCE v2)") && has(e, "3: 10.77.0.1 (RoCE v2)")) << e;
  }
  Code c{};
  std::string e = errorOf([&] { choose({t[0], t[1], t[2], t[3]}, "AF_INET6", "", 2); }, &c);
  EXPECT_EQ(c, Code::kInvalidArgument) << e;
  EXPECT_TRUE(has(e, "routable IPv6 address")) << e;
}

TEST(IbGidChoice, MalformedKnobsAreInvalidArgument) {
  for (auto [family, range, version, knob] :
       {std::tuple{"inet6", "", 2, "NCCL_IB_ADDR_FAMILY"}, {"AF_INET", "10.0.0.0", 2, "NCCL_IB_ADDR_RANGE"},
        {"AF_INET", "10.0.0.0/33", 2, "NCCL_IB_ADDR_RANGE"}, {"AF_INET", "fd00::/8", 2, "NCCL_IB_ADDR_RANGE"},
        {"AF_INET6", "10.0.0.0/8", 2, "NCCL_IB_ADDR_RANGE"}, {"AF_INET6", "fd00::/129", 2, "NCCL_IB_ADDR_RANGE"},
        {"AF_INET", "10.0.0.0/x", 2, "NCCL_IB_ADDR_RANGE"}, {"AF_INET", "", 3, "NCCL_IB_ROCE_VERSION_NUM"}}) {
    Code c{};
    std::string e = errorOf([&] { loom::ibnet::GidPolicy::parse(family, range, version); }, &c);
    EXPECT_EQ(c, Code::kInvalidArgument) << family << " " << range << " " << version << ": " << e;
    EXPECT_TRUE(has(e, knob)) << e;
  }
}

}  // namespace
}  // namespace loomtest
