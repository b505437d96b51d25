// The CTA-rank registry (kernels/common/cta_rank.h) replayed on the host: launches whose CTAs land on
// SMs unevenly and register in random orders, one after another on one registry as a runner's calls
// and graph replays do, with the same decisions the kernel takes (cta_rank.h's functions) and each
// fetch-add done in turn. Every launch must give a bijection onto [0, grid); with a clean registry the
// ranks come from the tickets and ranks 0..n0-1 sit on n0 distinct SMs; with a stale or garbled bank
// every CTA falls back to blockIdx.x, and the registry heals by the launch after next.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "kernels/common/cta_rank.h"

namespace fp4moe {
namespace {

using kernels::cta_rank;
using kernels::rank_bank_offset;
using kernels::rank_bank_words;
using kernels::rank_fresh_ticket;
using kernels::rank_reset_value;
using kernels::rank_slot_index;
using kernels::rank_ticket_index;
using kernels::rank_tickets_valid;

constexpr unsigned kStep = 2;  // direct_micro's grid barriers per launch

struct Launch {
  std::vector<int> rank;
  bool from_tickets = false;
};

// One launch tagged `tag` of CTAs b = 0..grid-1 on SMs smid[b]: all take their SM slot in the order
// `slot_order`, CTA 0 resets the next bank, then all take tickets in the order `ticket_order` (the
// kernel's steps 2 and 3, cta_rank.cuh), then every CTA reads the two ticket words.
Launch run_launch(std::vector<uint64_t>& reg, int sm_slots, unsigned tag, const std::vector<unsigned>& smid,
                  const std::vector<int>& slot_order, const std::vector<int>& ticket_order) {
  const int grid = static_cast<int>(smid.size());
  const int bank = rank_bank_offset(tag, kStep, sm_slots), next = rank_bank_offset(tag + kStep, kStep, sm_slots);
  EXPECT_NE(bank, next) << "tag " << tag << ": a launch must never reset its own bank";
  std::vector<uint64_t> slot_old(grid), ticket_old(grid);
  for (int b : slot_order) slot_old[b] = reg[bank + rank_slot_index(smid[b], sm_slots)]++;
  for (int i = 0; i < rank_bank_words(sm_slots); ++i) reg[next + i] = rank_reset_value(tag, kStep, i);
  for (int b : ticket_order) ticket_old[b] = reg[bank + rank_ticket_index(slot_old[b] == 0)]++;
  Launch l;
  l.from_tickets = rank_tickets_valid(reg[bank], reg[bank + 1], tag, grid);
  for (int b = 0; b < grid; ++b)
    l.rank.push_back(cta_rank(slot_old[b] == 0, ticket_old[b], reg[bank], reg[bank + 1], tag, grid, b));
  return l;
}

void expect_bijection(const Launch& l) {
  std::vector<int> sorted = l.rank;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> expected(sorted.size());
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(sorted, expected) << "ranks are not a bijection onto [0, grid)";
}

// Ranks 0..n0-1 on n0 distinct SMs, n0 = the SMs (slots) that hold any CTA.
void expect_first_ranks_spread(const Launch& l, const std::vector<unsigned>& smid, int sm_slots) {
  std::set<int> slots;
  for (unsigned s : smid) slots.insert(rank_slot_index(s, sm_slots));
  const int n0 = static_cast<int>(slots.size());
  std::set<int> seen;
  for (size_t b = 0; b < smid.size(); ++b)
    if (l.rank[b] < n0) seen.insert(rank_slot_index(smid[b], sm_slots));
  EXPECT_EQ(static_cast<int>(seen.size()), n0) << "ranks below n0 = " << n0 << " share an SM";
}

// A placement of `grid` CTAs over SM ids [0, sm_ids): uneven — a few SMs get none, some up to 4.
std::vector<unsigned> uneven_placement(std::mt19937& rng, int grid, int sm_ids) {
  std::vector<unsigned> smid(grid);
  for (int b = 0; b < grid; ++b) {
    // Half the CTAs two per SM in block order (the usual pattern), the rest anywhere.
    smid[b] = (b % 2 == 0 && b / 2 < sm_ids) ? b / 2 : static_cast<unsigned>(rng() % sm_ids);
  }
  return smid;
}

std::vector<int> shuffled(std::mt19937& rng, int n) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), 0);
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

TEST(CtaRank, ManyLaunchesWithUnevenPlacementGiveSpreadBijections) {
  constexpr int kSms = 132, kGrid = 264;
  std::mt19937 rng(7);
  std::vector<uint64_t> reg(kernels::rank_registry_words(kSms), 0);  // zeroed once, as the workspace is
  for (unsigned launch = 0; launch < 300; ++launch) {
    const unsigned tag = kStep * launch;
    const int grid = launch % 3 == 0 ? kGrid : kGrid - static_cast<int>(rng() % 40);  // the grid may be smaller
    const std::vector<unsigned> smid = uneven_placement(rng, grid, kSms);
    const Launch l = run_launch(reg, kSms, tag, smid, shuffled(rng, grid), shuffled(rng, grid));
    SCOPED_TRACE(testing::Message() << "launch " << launch);
    EXPECT_TRUE(l.from_tickets);
    expect_bijection(l);
    expect_first_ranks_spread(l, smid, kSms);
  }
}

// %smid values past the SM count (some parts number SMs sparsely) share slots: still a bijection from
// the tickets, and the first ranks spread over the distinct slots.
TEST(CtaRank, SmIdsPastTheSlotCountShareSlots) {
  constexpr int kSms = 132;
  std::mt19937 rng(11);
  std::vector<uint64_t> reg(kernels::rank_registry_words(kSms), 0);
  for (unsigned launch = 0; launch < 50; ++launch) {
    const std::vector<unsigned> smid = uneven_placement(rng, 264, 300);
    const Launch l = run_launch(reg, kSms, kStep * launch, smid, shuffled(rng, 264), shuffled(rng, 264));
    EXPECT_TRUE(l.from_tickets);
    expect_bijection(l);
    expect_first_ranks_spread(l, smid, kSms);
  }
}

// The epoch wraps at 2^32: the banks still alternate and the tags still match.
TEST(CtaRank, TagsWrapAround) {
  constexpr int kSms = 16, kGrid = 32;
  std::mt19937 rng(13);
  std::vector<uint64_t> reg(kernels::rank_registry_words(kSms), 0);
  unsigned tag = 0u - 3 * kStep;
  // As the launch before it would have left the bank.
  const int bank = rank_bank_offset(tag, kStep, kSms);
  for (int i = 0; i < rank_bank_words(kSms); ++i) reg[bank + i] = rank_reset_value(tag - kStep, kStep, i);
  for (int launch = 0; launch < 6; ++launch, tag += kStep) {
    const std::vector<unsigned> smid = uneven_placement(rng, kGrid, kSms);
    const Launch l = run_launch(reg, kSms, tag, smid, shuffled(rng, kGrid), shuffled(rng, kGrid));
    EXPECT_TRUE(l.from_tickets) << "tag " << tag;
    expect_bijection(l);
  }
}

// A bank that does not hold this launch's fresh words — left by an earlier launch's tag, counts from
// a launch that never finished, or a barrier count other than the tag step — makes every CTA take
// blockIdx.x; the launch still resets the next bank, so the one after next is back on tickets.
TEST(CtaRank, StaleOrGarbledBanksFallBackToBlockIndexAndHeal) {
  constexpr int kSms = 132, kGrid = 264;
  std::mt19937 rng(17);
  const unsigned tag = 40;
  struct Stale {
    const char* what;
    uint64_t first, other;
  };
  for (const Stale& s : {Stale{"an earlier launch's tag", rank_fresh_ticket(tag - 2 * kStep) + 100,
                               rank_fresh_ticket(tag - 2 * kStep) + 164},
                         Stale{"this tag, counts left over", rank_fresh_ticket(tag) + 3, rank_fresh_ticket(tag)},
                         Stale{"never reset (zero)", 0, 0},
                         Stale{"tags differ", rank_fresh_ticket(tag), rank_fresh_ticket(tag + kStep)}}) {
    SCOPED_TRACE(s.what);
    std::vector<uint64_t> reg(kernels::rank_registry_words(kSms), 0);
    const int bank = rank_bank_offset(tag, kStep, kSms);
    reg[bank] = s.first, reg[bank + 1] = s.other;
    for (int i = 2; i < rank_bank_words(kSms); ++i) reg[bank + i] = rng() % 3;  // stale SM slots too
    for (int launch = 0; launch < 3; ++launch) {
      const std::vector<unsigned> smid = uneven_placement(rng, kGrid, kSms);
      const Launch l = run_launch(reg, kSms, tag + kStep * launch, smid, shuffled(rng, kGrid), shuffled(rng, kGrid));
      expect_bijection(l);
      if (launch == 0) {
        EXPECT_FALSE(l.from_tickets);
        for (int b = 0; b < kGrid; ++b) EXPECT_EQ(l.rank[b], b);
      } else {
        EXPECT_TRUE(l.from_tickets) << "launch " << launch << " after the stale bank";
      }
    }
  }
  // A kernel with three barriers per launch on a registry stepped by two: the banks stop
  // alternating and the tags stop matching, but every launch is still a bijection.
  std::vector<uint64_t> reg(kernels::rank_registry_words(kSms), 0);
  for (unsigned launch = 0; launch < 20; ++launch) {
    const Launch l = run_launch(reg, kSms, 3 * launch, uneven_placement(rng, kGrid, kSms), shuffled(rng, kGrid),
                                shuffled(rng, kGrid));
    expect_bijection(l);
  }
}

}  // namespace
}  // namespace fp4moe
