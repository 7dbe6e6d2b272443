// libFuzzer target over the recipe front end: recipe bytes -> parse/validate -> role
// resolution -> lower + passes -> printer, buffers, CUDA codegen, CPU reference (everything
// run_recipe in fuzz_entry.h does). Built with -DQFORGE_FUZZ=ON (clang); run by
// scripts/fuzz.sh. A UserError is a normal outcome; any other exception is reported, then
// aborts, so libFuzzer keeps the input as a crash.
//
// Byte-level mutations of JSON mostly break its syntax (about 98% of the inputs they make fail
// to parse), so half of the mutations are structural: the input is parsed, one node is
// replaced, added, removed or copied using the recipe vocabulary (keys, enum values, block
// shapes, edge numbers), and the document is written back. That reaches the combinations of
// valid modes, blocks, formats and layouts that lowering, the passes and codegen see.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/fuzz/fuzz_entry.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

using json = nlohmann::json;
using Rng = std::minstd_rand;

constexpr const char* kKeys[] = {
    "$schema", "qforge_recipe", "name", "comment", "usage", "roles", "match", "rowwise",
    "columnwise", "format", "scaling", "mode", "block", "epsilon", "pow2", "margin",
    "history_length", "amax_compute", "rule", "rounding", "rht", "sign_mask", "layout",
    "scale_layout", "dtype"};
constexpr const char* kWords[] = {
    "e4m3", "e5m2", "e2m1", "e2m3", "e3m2", "int8", "identity", "per_tensor_current",
    "per_tensor_delayed", "per_channel", "block", "mx", "nvfp4", "none", "max", "most_recent",
    "rceil", "floor", "nearest", "stochastic", "transposed", "same", "compact", "swizzled",
    "input", "bf16", "fp16", "fp32", "training", "inference", "memory", "0xD7E8", "0x0",
    "0xFFFF", "0x1", "*:*", "*:input", "*:weight", "*:grad_output", "linear:input",
    "grouped_linear:weight", "linear:weight:qkv", "*:*:proj", "linear:*", "any:any", ""};
constexpr int kSides[] = {1, 2, 8, 16, 32, 64, 128, 256, 512, 1024, 4096};
constexpr double kNumbers[] = {0, 1, -1, 2, 15, 16, 31, 32, 64, 65, 128, 512, 1024, 4096, 4097,
                               65536, 65537, 2147483648.0, 1e-12, 0.5, 1e29, 1e30, 1e300};

template <class T, size_t N>
const T& pick(const T (&a)[N], Rng& rng) {
  return a[rng() % N];
}

json random_value(Rng& rng, int depth = 0) {
  switch (rng() % (depth > 1 ? 6 : 9)) {
    case 0:
    case 1: return pick(kWords, rng);
    case 2: {
      const double v = pick(kNumbers, rng);
      if (v == std::floor(v) && std::fabs(v) < 9e18) return int64_t(v);
      return v;
    }
    case 3: return json::array({pick(kSides, rng), pick(kSides, rng)});
    case 4: return bool(rng() % 2);
    case 5: return rng() % 4 ? json(pick(kNumbers, rng)) : json(nullptr);
    case 6: {  // a scaling object
      json s = {{"mode", pick(kWords, rng)}};
      if (rng() % 2) s["block"] = json::array({pick(kSides, rng), pick(kSides, rng)});
      if (rng() % 3 == 0) s[pick(kKeys, rng)] = random_value(rng, depth + 1);
      return s;
    }
    case 7: {  // a direction
      json d = {{"format", pick(kWords, rng)}, {"scaling", random_value(rng, depth + 1)}};
      for (int i = int(rng() % 3); i > 0; --i) d[pick(kKeys, rng)] = random_value(rng, depth + 1);
      return d;
    }
    default: {  // a rule
      json r = {{"match", pick(kWords, rng)}};
      r[rng() % 2 ? "rowwise" : "columnwise"] = random_value(rng, 2);
      return r;
    }
  }
}

// Every node of the document, as pointers to it (the root first).
void collect(json& j, std::vector<json*>& out) {
  out.push_back(&j);
  if (j.is_object() || j.is_array())
    for (auto& child : j) collect(child, out);
}

void mutate_structure(json& doc, Rng& rng) {
  std::vector<json*> nodes;
  collect(doc, nodes);
  json& n = *nodes[rng() % nodes.size()];
  switch (rng() % 6) {
    case 0:  // replace a value
      n = random_value(rng);
      break;
    case 1:  // add or replace a key
      if (n.is_object()) n[pick(kKeys, rng)] = random_value(rng);
      else if (n.is_array()) n.push_back(random_value(rng));
      else n = random_value(rng);
      break;
    case 2:  // remove a key or element
      if (n.is_object() && !n.empty()) {
        auto it = n.begin();
        std::advance(it, long(rng() % n.size()));
        n.erase(it);
      } else if (n.is_array() && !n.empty()) {
        n.erase(n.begin() + long(rng() % n.size()));
      }
      break;
    case 3: {  // copy another node of the document here (e.g. a direction to the other side)
      json copy = *nodes[rng() % nodes.size()];
      n = std::move(copy);
      break;
    }
    case 4:  // a number nudged to a neighbour
      if (n.is_number_unsigned() && n.get<uint64_t>() > (uint64_t(1) << 62)) {
        n = n.get<uint64_t>() / 2;
      } else if (n.is_number_integer()) {
        const int64_t v = n.get<int64_t>();
        n = v > -(int64_t(1) << 62) && v < (int64_t(1) << 62) ? v + int64_t(rng() % 3) - 1 : v / 2;
      } else if (n.is_number()) {
        n = n.get<double>() * 2;
      } else {
        n = random_value(rng);
      }
      break;
    default:  // a role pattern or a rule of the recipe duplicated
      if (doc.is_object() && doc.contains("roles") && doc["roles"].is_array() && !doc["roles"].empty()) {
        json rule = doc["roles"][rng() % doc["roles"].size()];
        if (rule.is_object()) rule["match"] = pick(kWords, rng);
        doc["roles"].push_back(std::move(rule));
      } else {
        n = random_value(rng);
      }
      break;
  }
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  Rng rng(seed);
  if (rng() % 2) {
    json doc = json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
    if (!doc.is_discarded()) {
      for (int i = 1 + int(rng() % 3); i > 0; --i) mutate_structure(doc, rng);
      const std::string out = doc.dump(rng() % 2 ? 2 : -1, ' ', false, json::error_handler_t::replace);
      if (out.size() <= max_size) {
        std::memcpy(data, out.data(), out.size());
        return out.size();
      }
    }
  }
  return LLVMFuzzerMutate(data, size, max_size);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    qf::fuzz::run_recipe(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "recipe_fuzzer: uncaught exception: %s\n", e.what());
    std::abort();
  }
  return 0;
}
