// The device side of CTA ranks (cta_rank.h says what they are and why they form a bijection).
//
// Thread 0 of each CTA registers in steps placed apart in the kernel's setup, so that none waits on
// the previous one's load or atomic: the launch tag at kernel start, the SM-slot fetch-add after the
// setup, the ticket fetch-add (whose word depends on the slot's answer) just before the first grid
// barrier. The barrier's fences order every CTA's fetch-adds before any CTA leaves it, so the ticket
// words read after it are final. Thread 0 of CTA 0 also resets the bank the next launch will use.
#pragma once

#include <cstdint>

#include "kernels/common/cta_rank.h"
#include "kernels/common/grid_barrier.cuh"
#include "kernels/common/ptx.cuh"

namespace fp4moe::kernels {

// The registry: rank_registry_words(sm_slots) words, zeroed once when the workspace is made.
struct CtaRanks {
  unsigned long long* words;
  int sm_slots;  // the device's SM count; %smid values past it share slots (smid % sm_slots)
};

// Thread 0's registration, carried from step to step.
struct CtaRankState {
  unsigned tag;              // the grid barrier's epoch at kernel start
  unsigned long long* bank;  // this launch's bank (from step 2)
  unsigned long long slot_old, ticket_old;
};

// Step 1, kernel start (thread 0): the tag, left in flight (nothing uses it before step 2).
__device__ __forceinline__ CtaRankState rank_begin(const GridBarrier& b) {
  CtaRankState s{};
  s.tag = ptx::ld_relaxed_gpu(b.epoch);
  return s;
}
// Step 2, after the setup (thread 0): the CTA's arrival on its SM. tag_step: the grid barriers each
// launch passes (its epoch's growth). CTA 0 also resets the other bank, the next launch's: no CTA of
// this launch reads or writes it, and the kernel's end publishes the stores.
__device__ __forceinline__ void rank_arrive(CtaRankState& s, const CtaRanks& r, unsigned tag_step, unsigned smid) {
  s.bank = r.words + rank_bank_offset(s.tag, tag_step, r.sm_slots);
  s.slot_old = atomicAdd(s.bank + rank_slot_index(smid, r.sm_slots), 1ull);
  if (blockIdx.x == 0) {
    unsigned long long* next = r.words + rank_bank_offset(s.tag + tag_step, tag_step, r.sm_slots);
    for (int i = 0; i < rank_bank_words(r.sm_slots); ++i) next[i] = rank_reset_value(s.tag, tag_step, i);
  }
}
// Step 3, before the first grid barrier (thread 0): a ticket of the CTA's class.
__device__ __forceinline__ void rank_take_ticket(CtaRankState& s) {
  s.ticket_old = atomicAdd(s.bank + rank_ticket_index(s.slot_old == 0), 1ull);
}
// After the first grid barrier (thread 0): the CTA's rank; *from_tickets says whether the ticket words
// were valid (false: rank = blockIdx.x in every CTA).
__device__ __forceinline__ int rank_after_barrier(const CtaRankState& s, bool* from_tickets) {
  // Written by other CTAs' atomics in this launch: read at L2, not through L1. 16-byte aligned
  // (rank_bank_words is even).
  const ulonglong2 w = __ldcg(reinterpret_cast<const ulonglong2*>(s.bank));
  *from_tickets = rank_tickets_valid(w.x, w.y, s.tag, gridDim.x);
  return cta_rank(s.slot_old == 0, s.ticket_old, w.x, w.y, s.tag, gridDim.x, blockIdx.x);
}

}  // namespace fp4moe::kernels
