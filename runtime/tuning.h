// Tile configurations chosen by `qforge tune`, stored in the kernel cache roots next to the
// kernels: <root>/qforge-v1/tuning/<key>.json, where the key is the SHA-256 of the plan
// without its tile, the arch, the device name and the templates hash (a kernel change or
// another GPU model never picks up a stale choice). Quantizer consults the records when it
// loads kernels for a device; QFORGE_TUNING=0 ignores them.
#pragma once
#include <optional>
#include <string>

#include "compiler/ir.h"
#include "runtime/kernel_cache.h"

namespace qf::rt {

struct TuningRecord {
  TileConfig tile;         // the winner
  double time_us = 0;      // its time on the tuning shape
  double default_us = 0;   // the default tile's time on the same shape
  int64_t m = 0, k = 0;    // the tuning shape
  std::string device;      // GPU name
  std::string arch;
};

std::string tuning_key(const Plan& plan, const std::string& arch, const std::string& device);

// The stored winner for this plan on this arch + device, if any, valid for the plan (tile_fits)
// and not disabled by QFORGE_TUNING=0. Looks in the writable root, then the read-only roots;
// a malformed record is ignored with one warning.
std::optional<TuningRecord> find_tuning(const Plan& plan, const std::string& arch, const std::string& device,
                                        const KernelCache& cache = KernelCache::global());

// Writes the record atomically (temp file + rename) into the writable root. Returns false
// (with a warning) when the cache has no usable writable root.
bool store_tuning(const Plan& plan, const TuningRecord& rec, const KernelCache& cache = KernelCache::global());

}  // namespace qf::rt
