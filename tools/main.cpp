// qforge: the command-line tool. `qforge help` lists the subcommands.
#include <cstring>
#include <iostream>
#include <map>

#include "compiler/error.h"
#include "runtime/kernel_cache.h"
#include "runtime/nvrtc.h"
#include "tools/commands.h"

namespace {

const char* kUsage = R"(usage: qforge <command> [options]

commands:
  check [--quiet] [--role R]... <recipe.json>...
                                    validate recipes; print how the standard roles (or R) resolve
  inspect <recipe.json> --role R    print the kernel plan for one role
          [--dtype bf16|fp16|fp32] [--usage training|inference|memory] [--grouped]
          [--dump-after PASS|all] [--shape MxK] [--source] [--resources]
  quantize --recipe R --role ROLE --input x.npy --out DIR
          [--usage U] [--dtype bf16|fp16|fp32] [--seed S] [--offset O]
          [--scale F] [--scale NAME=F] [--splits 3,0,5] [--device cpu|cuda]
                                    quantize a 2-D tensor on the CPU reference (or GPU 0 with
                                    --device cuda), writing one
                                    <buffer>.npy per output plus manifest.json into DIR.
                                    Input dtype from the .npy descr: '<f4' fp32, '<f2' fp16,
                                    '<u2' bf16 bit patterns; --dtype must agree, except that
                                    '<f4' input with --dtype bf16|fp16 is first rounded (RNE)
                                    to that dtype. --seed/--offset: stochastic rounding state;
                                    --scale: delayed-scaling scale (all inputs, or one by
                                    name); --splits: grouped quantize, member sizes summing to M
  prewarm <recipes...|dir> [--arch sm_90a,sm_100a] [-j N] [--dtype bf16,fp16,fp32]
          [--usage training,inference,memory] [--role R]...
                                    compile every kernel the recipes can need into the cache
                                    (and their "gemms" for sm_90a, unless --role is given)
  tune <recipes...|dir> [--role R]... [--usage training,inference] [--dtype bf16]
       [--shape MxK] [--ms MS] [--search all|tiles|registers] [--dry-run] [--verbose]
                                    time candidate tiles (and register budgets) of each plan on
                                    GPU 0 and store the fastest in the kernel cache (used by
                                    later loads)
  gemm [--scaling tensor|rowwise|blockwise|mxfp8|nvfp4|none|channel]
       [--a-format e4m3|e5m2|int8|e2m1|bf16|fp16] [--b-format ...]
       [--groups G] [--m M] [--n N] [--k K] [--uneven [--zero-groups Z]] [--splits 3,0,5]
       [--out bf16|fp32] [--accumulate] [--alpha] [--fast-accum]
       [--block-m 64|128] [--block-n 64|128|192|256] [--stages S] [--multicast 1|2] [--raster R]
       [--ordered on|off] [--max-ctas N] [--m-max M_MAX]
       [--k-grouped [--members]] [--scale-layout compact|mn_major] [--route fused|dequant|auto]
       [--check [--check-rows R]] [--bench [--iters N] [--warmup W]] [--seed S] [--json FILE]
       [--source | --arch sm_90a]
                                    grouped GEMM on GPU 0 with random operands (G groups of M
                                    rows, or --splits; none: bf16 / fp16 operands; channel: bf16 /
                                    fp16 x int8 weights with per-channel scales; --m-max: masked
                                    layout [G, M_MAX, K] with those as counts; --k-grouped: wgrad,
                                    D[g] [M, N] over K tokens per group; any scaling but channel;
                                    --members: each group's operands its own [M, tokens] and
                                    [N, tokens] copies back to back, as grouped quantize writes;
                                    --scale-layout mn_major: blockwise / mxfp8 1D scale grids
                                    stored [blocks, rows] (M-grouped: A's, per group, padded to
                                    4 rows; mxfp8 B's per expert), as "scale_layout": "mn_major"
                                    writes; --route dequant: mxfp8 / nvfp4 operands dequantized
                                    once into 16-bit copies, then the bf16 / fp16 GEMM; auto:
                                    the one expected to be faster for the problem, printed):
                                    --check compares sampled rows with the
                                    float64 CPU reference, --bench prints TFLOP/s; without a GPU,
                                    --source prints every kernel's CUDA (auto: both routes') and
                                    --arch compiles them
  list [--json]                     list the kernel cache's entries
  verify                            check every cached kernel against its key (exit 1 on problems)
  clear [--unused-for 30d] [--max-size 2G] [--stale] [--dry-run]
                                    remove every kernel of the writable cache directory, or
                                    those unused for that long (s, m, h, d), the least recently
                                    used beyond that size (B, K, M, G, T), and those no build of
                                    this qforge and NVRTC can hit (or damaged); --dry-run counts
  version (or --version)            qforge's version, the NVRTC it compiles with, and what keys
                                    its kernel cache (cache format, device headers' hash)
  help                              this text

exit codes: 0 ok, 1 check found problems, 2 bad input (recipe, arguments, files), 3 internal error
)";

// qforge's version, the NVRTC it compiles with, and the kernel cache's format and device-header
// hash: what keys every cached kernel, and what a bug report needs.
int cmd_version(const qf::cli::Argv& args) {
  if (!args.empty()) throw qf::UserError(args[0], "version takes no arguments");
  std::cout << "qforge " << QFORGE_VERSION << "\n"
            << "nvrtc " << qf::rt::nvrtc_version() << "\n"
            << "kernel cache " << qf::rt::kCacheDirName << " (schema " << qf::rt::kCacheSchemaVersion
            << "), device headers " << qf::rt::templates_hash().substr(0, 16) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace qf::cli;
  if (argc < 2 || !std::strcmp(argv[1], "help") || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::map<std::string, int (*)(const Argv&)> commands = {
      {"check", cmd_check}, {"inspect", cmd_inspect}, {"quantize", cmd_quantize},
      {"prewarm", cmd_prewarm}, {"tune", cmd_tune}, {"gemm", cmd_gemm}, {"list", cmd_list}, {"verify", cmd_verify}, {"clear", cmd_clear},
      {"version", cmd_version}, {"--version", cmd_version}};
  const std::string cmd = argv[1];
  Argv args(argv + 2, argv + argc);
  auto it = commands.find(cmd);
  try {
    if (it == commands.end()) throw qf::UserError("", "unknown command \"" + cmd + "\" (see qforge help)");
    return it->second(args);
  } catch (const qf::UserError& e) {
    std::cerr << "qforge " << cmd << ": error: " << e.what() << "\n";
    return 2;
  } catch (const qf::InternalError& e) {
    std::cerr << "qforge " << cmd << ": " << e.what() << "\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "qforge " << cmd << ": internal error: " << e.what() << "\n";
    return 3;
  }
}
