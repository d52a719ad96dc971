// The rendezvous store and the launcher-environment parsing, in one process.
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "comm/communicator.h"
#include "comm/env.h"
#include "comm/store.h"

namespace mt::comm {
namespace {

const std::string kSecret = "0123456789abcdef-test";

TEST(TcpStore, SetGetAddCheckAcrossClients) {
  TcpStoreServer server("127.0.0.1", 0, kSecret);
  TcpStore a("127.0.0.1", server.port(), std::chrono::seconds(5), kSecret, 0);
  TcpStore b("127.0.0.1", server.port(), std::chrono::seconds(5), kSecret, 1);
  EXPECT_FALSE(a.check("k"));
  // b waits for a key that a sets later: the GET is parked on the server, not polled.
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    a.set("k", std::string("v\0x", 3));
  });
  EXPECT_EQ(b.get("k"), std::string("v\0x", 3));
  t.join();
  EXPECT_TRUE(a.check("k"));
  EXPECT_EQ(a.add("n", 2), 2);
  EXPECT_EQ(b.add("n", 3), 5);
  PrefixStore pa("g", std::shared_ptr<Store>(&a, [](Store*) {}));
  pa.set("x", "1");
  EXPECT_TRUE(a.check("g/x"));
  a.goodbye();
  b.goodbye();
}

TEST(TcpStore, GetTimesOutWithTheKeyInTheMessage) {
  TcpStoreServer server("127.0.0.1", 0, kSecret);
  TcpStore a("127.0.0.1", server.port(), std::chrono::milliseconds(300), kSecret, 0);
  auto t0 = std::chrono::steady_clock::now();
  try {
    a.get("never");
    FAIL();
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
}

TEST(TcpStore, ConnectionDroppedWithoutGoodbyeIsALostRank) {
  TcpStoreServer server("127.0.0.1", 0, kSecret);
  TcpStore a("127.0.0.1", server.port(), std::chrono::seconds(5), kSecret, 0);
  {
    TcpStore b("127.0.0.1", server.port(), std::chrono::seconds(5), kSecret, 3);
    TcpStore c("127.0.0.1", server.port(), std::chrono::seconds(5), kSecret, 4);
    c.goodbye();
  }
  std::vector<int> lost;
  for (int i = 0; i < 50 && lost.empty(); ++i) {
    lost = a.lost_ranks();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(lost, std::vector<int>{3});
}

TEST(TcpStore, NoServerGivesAClearErrorWithinTheTimeout) {
  try {
    TcpStore a("127.0.0.1", 1, std::chrono::milliseconds(300), kSecret, 0);
    FAIL();
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_ADDR"), std::string::npos) << e.what();
  }
}

DistEnv env_of(std::map<std::string, std::string> m) {
  return detect_dist_env([&m](const char* n) -> const char* {
    auto it = m.find(n);
    return it == m.end() ? nullptr : it->second.c_str();
  });
}

TEST(DistEnv, TorchrunSlurmOpenMpiAndSingle) {
  auto s = env_of({});
  EXPECT_EQ(s.world_size, 1);
  EXPECT_EQ(s.master_port, 29500);
  auto t = env_of({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(t.rank, 3);
  EXPECT_EQ(t.world_size, 8);
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.master_addr, "node7");
  EXPECT_EQ(t.master_port, 1234);
  auto o = env_of({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"},
                   {"SLURM_NTASKS", "9"}});
  EXPECT_EQ(o.world_size, 2);
  EXPECT_EQ(o.source, "OpenMPI environment");
  auto sl = env_of({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                    {"SLURM_NTASKS_PER_NODE", "4(x2)"}});
  EXPECT_EQ(sl.rank, 5);
  EXPECT_EQ(sl.local_world_size, 4);
  EXPECT_EQ(sl.source, "SLURM environment");
}

TEST(DistEnv, BadValuesNameTheVariable) {
  auto msg = [](std::map<std::string, std::string> m) {
    try {
      env_of(std::move(m));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg({{"RANK", "x"}, {"WORLD_SIZE", "2"}}).find("RANK='x'"), std::string::npos);
  EXPECT_NE(msg({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("WORLD_SIZE"), std::string::npos);
  EXPECT_NE(msg({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}}).find("WORLD_SIZE='99999999999' is not an integer in 1 .."),
            std::string::npos);
  EXPECT_NE(msg({{"RANK", "0"}}).find("WORLD_SIZE"), std::string::npos);
  EXPECT_NE(msg({{"MASTER_PORT", "99999"}}).find("MASTER_PORT"), std::string::npos);
  EXPECT_NE(msg({{"MT_STORE_SECRET", "short"}}).find("MT_STORE_SECRET is 5 characters long"), std::string::npos);
  EXPECT_NE(msg({{"MT_STORE_SECRET", std::string(300, 'x')}}).find("MT_STORE_SECRET"), std::string::npos);
}

TEST(DistEnv, StoreSecretIsReadAndRandomOnesDiffer) {
  EXPECT_EQ(env_of({}).store_secret, "");
  EXPECT_EQ(env_of({{"MT_STORE_SECRET", "0123456789abcdef"}}).store_secret, "0123456789abcdef");
  const std::string a = random_store_secret(), b = random_store_secret();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace mt::comm
