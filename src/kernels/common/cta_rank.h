// CTA ranks that spread a cooperative launch's items over SMs (reference F4's grid, placed by the
// hardware). A kernel whose phases take `item = blockIdx.x, + gridDim.x, …` leaves the item → SM map
// to the block scheduler, which may put two low block indices on one SM while other SMs get none of
// the first items. With ranks instead, ranks 0..n0-1 belong to one CTA on each of n0 distinct SMs
// (the first of each SM to register) and n0.. to the rest, so items ≤ n0 run on an SM each.
//
// The registry (device memory, zeroed once when the workspace is made): two banks, each
//   [first-on-SM ticket word][other ticket word][arrivals per SM slot × sm_slots] (64-bit words)
// A ticket word is (launch tag << 32) | count. The tag is the grid barrier's epoch at kernel start,
// the same in every CTA (no CTA can advance it before all have arrived at the launch's first
// barrier), and it grows by the launch's barrier count per launch, so consecutive launches take the
// two banks in turn. A launch uses bank rank_bank(tag) and resets the other one for the next launch,
// whose words no CTA of this launch touches; so no host work is needed between launches or replays.
//
// Per CTA: one fetch-add on its SM slot (the old count 0: first on its SM), then one fetch-add on the
// ticket word of its class; after the first grid barrier every CTA reads both ticket words, which no
// CTA writes again in this launch, so all see the same values and take the same branch of cta_rank.
// Why the result is a bijection onto [0, grid) whatever the placement: when both words carry this
// launch's tag and their counts add up to the grid, each started at (tag << 32) | 0 (counts only grow
// by this launch's adds, one per CTA), so the first class holds tickets 0..n0-1 and the others
// 0..grid-n0-1, and rank = first ? ticket : n0 + ticket. Anything else (a bank left by a launch with
// another barrier count, a garbled word) fails that check in every CTA at once, and every CTA takes
// rank = blockIdx.x — slower, never wrong. Which CTA counts as first (slots shared by SM ids past
// sm_slots, uneven CTAs per SM) only moves CTAs between the two classes: it affects the spread, not
// the bijection.
//
// Plain integer functions, callable on host and device: the kernel (cta_rank.cuh) and the CPU test
// that replays arrival orders (tests/cpu/test_cta_rank.cpp) decide with the same code.
#pragma once

#include <cstdint>

#include "fp4moe/formats.h"  // FP4MOE_HD

namespace fp4moe::kernels {

// 64-bit words per bank, even so that each bank's two ticket words form one 16-byte load.
FP4MOE_HD int rank_bank_words(int sm_slots) { return (2 + sm_slots + 1) & ~1; }
FP4MOE_HD int rank_registry_words(int sm_slots) { return 2 * rank_bank_words(sm_slots); }
// Word offsets of a launch's bank, and of its ticket words (class 0: first on its SM) and SM slots.
FP4MOE_HD int rank_bank_offset(unsigned tag, unsigned tag_step, int sm_slots) {
  return static_cast<int>((tag / tag_step) & 1u) * rank_bank_words(sm_slots);
}
FP4MOE_HD int rank_ticket_index(bool first) { return first ? 0 : 1; }
FP4MOE_HD int rank_slot_index(unsigned smid, int sm_slots) { return 2 + static_cast<int>(smid % sm_slots); }
// A ticket word that no launch has taken from yet: its value when the launch tagged `tag` starts.
FP4MOE_HD uint64_t rank_fresh_ticket(unsigned tag) { return static_cast<uint64_t>(tag) << 32; }
// What the launch tagged `tag` writes into word i of the other bank, for the next launch.
FP4MOE_HD uint64_t rank_reset_value(unsigned tag, unsigned tag_step, int i) {
  return i < 2 ? rank_fresh_ticket(tag + tag_step) : 0;
}
// Whether the two ticket words, as every CTA reads them after the first barrier, describe a launch of
// `grid` CTAs tagged `tag` that started from fresh words (ranks from tickets) or not (ranks = blockIdx.x).
FP4MOE_HD bool rank_tickets_valid(uint64_t first_word, uint64_t other_word, unsigned tag, unsigned grid) {
  const uint64_t fresh = rank_fresh_ticket(tag);
  return (first_word >> 32) == tag && (other_word >> 32) == tag && (first_word - fresh) + (other_word - fresh) == grid;
}
// The rank of a CTA from what it took (first: its SM-slot fetch-add returned 0; ticket_old: what its
// ticket fetch-add returned) and the two ticket words.
FP4MOE_HD int cta_rank(bool first, uint64_t ticket_old, uint64_t first_word, uint64_t other_word, unsigned tag,
                       unsigned grid, unsigned block) {
  if (!rank_tickets_valid(first_word, other_word, tag, grid)) return static_cast<int>(block);
  const uint64_t fresh = rank_fresh_ticket(tag);
  const unsigned ticket = static_cast<unsigned>(ticket_old - fresh);
  return static_cast<int>(first ? ticket : static_cast<unsigned>(first_word - fresh) + ticket);
}

}  // namespace fp4moe::kernels
