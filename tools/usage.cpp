// The qforge subcommands' table: how main() dispatches each one and the only copy of its usage
// text. `qforge help` prints every entry's name and summary; `qforge help <command>`,
// `qforge <command> --help` and `-h` print one entry in full; docs/cli.md holds the same text
// (tests/lit/cli_doc.test checks that it does).
#include <iostream>
#include <sstream>

#include "compiler/error.h"
#include "tools/commands.h"

namespace qf::cli {

namespace {

constexpr const char* kExitCodes =
    "exit codes: 0 ok, 1 check / verify found problems, 2 bad input (recipe, arguments, files), "
    "3 internal error";

const Command kCommands[] = {
    {"check", cmd_check,
     "[--quiet] [--role R]... <recipe.json>...",
     "validate recipes; print how the standard roles resolve",
     "Parses and validates each recipe, resolves the standard roles (or each --role R), compiles\n"
     "their plans for the recipe's usage and prints one line per role (the rule it resolves to and\n"
     "what the plan writes) and one per \"gemms\" entry. Each recipe's line says ok or how many\n"
     "problems it has; --quiet prints only the roles with one.\n"
     "Exit 0 ok, 1 problems (a rule tie, a usage a rule cannot serve; with several files, a file\n"
     "that does not load, after checking the others), 2 a single file that does not load."},
    {"inspect", cmd_inspect,
     "<recipe.json> --role R\n"
     "[--dtype bf16|fp16|fp32] [--usage training|inference|memory] [--grouped]\n"
     "[--dump-after PASS|all] [--shape MxK] [--source] [--resources]",
     "print the kernel plan for one role",
     "Prints the plan the recipe's rule for role R lowers to (after each named pass with\n"
     "--dump-after), its buffers for a shape (--shape, default 256x512), with --source the emitted\n"
     "CUDA (the complete program; for plans with the one-launch fused kernel also the separate\n"
     "form's, which first calls without it compile), and with --resources what ptxas gives each\n"
     "kernel for sm_90a: registers, stack, spill bytes, threads, the cast kernel's launch-bound min\n"
     "blocks (NVRTC; no GPU needed).\n"
     "--dtype: the input dtype (default bf16); --usage: default the recipe's; --grouped: the\n"
     "grouped (MoE) call's plan."},
    {"quantize", cmd_quantize,
     "--recipe R --role ROLE --input x.npy --out DIR\n"
     "[--usage U] [--dtype bf16|fp16|fp32] [--seed S] [--offset O]\n"
     "[--scale F] [--scale NAME=F] [--splits 3,0,5] [--device cpu|cuda]",
     "quantize a 2-D .npy tensor on the CPU reference (or GPU 0)",
     "Quantizes a 2-D tensor on the CPU reference (or GPU 0 with --device cuda), writing one\n"
     "<buffer>.npy per output plus manifest.json (per buffer: dtype, shape, bytes, and for block\n"
     "scale grids the scale_layout a GEMM must read them in) into DIR.\n"
     "Input dtype from the .npy descr: '<f4' fp32, '<f2' fp16, '<u2' bf16 bit patterns; --dtype\n"
     "must agree, except that '<f4' input with --dtype bf16|fp16 is first rounded (RNE) to that\n"
     "dtype. The shape is checked against a call's limits (each dimension at most 2^31, M * K at\n"
     "most 2^50) before the data is read.\n"
     "--seed / --offset: stochastic rounding state (decimal, or 0x hex); --scale: delayed\n"
     "scaling's scale (for all inputs, or one by name); --splits: grouped quantize, member sizes\n"
     "summing to M."},
    {"prewarm", cmd_prewarm,
     "<recipes...|dir> [--arch sm_90a,sm_100a] [-j N] [--dtype bf16,fp16,fp32]\n"
     "[--usage training,inference,memory] [--role R]... [--tiles any,interior] [--quiet]",
     "compile every kernel the recipes can need into the kernel cache",
     "Compiles every quantize kernel the recipes can need (standard role x usage x input dtype, for\n"
     "each --arch; default: GPU 0's, else sm_90a; grouped calls share the kernel), delayed scaling's\n"
     "amax-history update (one per rule and format), and the recipes' \"gemms\" for sm_90a unless\n"
     "--role is given, into the kernel cache. A directory stands for its *.json recipes.\n"
     "--tiles: which quantize programs (default both): any, those every call can take; interior,\n"
     "those for interior tiles only, which single tensors whose M and K are multiples of the tile\n"
     "and of 16 take where the cache has them (smaller, faster kernels; the same bits).\n"
     "-j: parallel compiles (default: the CPUs this process may run on). Prints a progress bar\n"
     "(not with --quiet, or when stderr is not a terminal) and a summary table."},
    {"tune", cmd_tune,
     "<recipes...|dir> [--role R]... [--usage training,inference] [--dtype bf16]\n"
     "[--shape MxK] [--ms MS] [--search all|tiles|registers] [--dry-run] [--verbose]",
     "time each plan's candidate tiles on GPU 0 and store the fastest",
     "Times every candidate tile of each plan on GPU 0 (compiler/passes/select_tiles.h\n"
     "tile_candidates: tile shapes, and the default tile at register budgets shown as /mbN), on a\n"
     "random tensor of --shape (default 8192x8192) for --ms milliseconds each (default 20), and\n"
     "stores the winner, when it beats the default by more than 2 %, in the kernel cache next to\n"
     "the kernels (keyed by plan, arch, GPU model and device headers); later loads on that GPU\n"
     "model use it (QFORGE_TUNING=0 ignores it). --search tiles: only the tile shapes; registers:\n"
     "only the default tile's register budgets. --dry-run times and reports without storing;\n"
     "--verbose prints every candidate's time."},
    {"gemm", cmd_gemm,
     "[--scaling tensor|rowwise|blockwise|mxfp8|nvfp4|none|channel]\n"
     "[--a-format e4m3|e5m2|int8|e2m1|bf16|fp16] [--b-format ...]\n"
     "[--groups G] [--m M] [--n N] [--k K] [--uneven [--zero-groups Z]] [--splits 3,0,5]\n"
     "[--out bf16|fp32] [--accumulate] [--alpha] [--fast-accum]\n"
     "[--block-m 64|128] [--block-n 64|128|192|256] [--stages S] [--multicast 1|2] [--raster R]\n"
     "[--ordered on|off] [--max-ctas N] [--m-max M_MAX]\n"
     "[--k-grouped [--members]] [--scale-layout compact|mn_major] [--route fused|dequant|auto]\n"
     "[--check [--check-rows R]] [--bench [--iters N] [--warmup W]] [--seed S] [--json FILE]\n"
     "[--source | --arch sm_90a]",
     "grouped GEMM on GPU 0 with random operands",
     "Runs a grouped GEMM (sm_90a) on GPU 0 with random operands: G groups (default 8) of M rows\n"
     "(default 4096), or --splits; N default 4096, K default 7168, --scaling default blockwise.\n"
     "none: bf16 / fp16 operands; channel: bf16 / fp16 x int8 weights with per-channel scales.\n"
     "--m-max: the masked layout [G, M_MAX, K] with the group sizes as counts.\n"
     "--k-grouped: wgrad, D[g] [M, N] over K tokens per group (any scaling but channel);\n"
     "--members: each group's operands its own [M, tokens] and [N, tokens] copies back to back, as\n"
     "grouped quantize writes them.\n"
     "--scale-layout mn_major: blockwise / mxfp8 1D scale grids stored [blocks, rows] (M-grouped:\n"
     "A's, per group, padded to 4 rows; mxfp8 B's per expert), as \"scale_layout\": \"mn_major\"\n"
     "writes them.\n"
     "--route dequant: mxfp8 / nvfp4 operands dequantized once into 16-bit copies, then the bf16 /\n"
     "fp16 GEMM; auto: the one expected to be faster for the problem (printed).\n"
     "--check compares sampled rows with the float64 CPU reference; --bench prints TFLOP/s.\n"
     "Without a GPU: --source prints every kernel's CUDA (auto: both routes'), --arch compiles\n"
     "them. docs/gemm.md has the design."},
    {"list", cmd_list,
     "[--json]",
     "list the kernel cache's entries",
     "One line per cached kernel (key, kind, arch, size, recipe, role, form: a quantize program's,\n"
     "all or separate, created, last use; read-only roots' entries marked), then the totals;\n"
     "--json: the same as JSON."},
    {"verify", cmd_verify,
     "",
     "check every cached kernel against its key (exit 1 on problems)",
     "Checks every entry of the kernel cache against its key, size and SHA-256 and names those that\n"
     "fail (a damaged entry is recompiled on next use). Exit 0 ok, 1 problems."},
    {"clear", cmd_clear,
     "[--unused-for 30d] [--max-size 2G] [--stale] [--dry-run]",
     "empty the writable kernel cache, or evict from it",
     "Without options: removes every kernel (and qforge tune's tile choices) of the writable cache\n"
     "directory. With them, evicts: kernels unused for longer than --unused-for (s, m, h, d), then\n"
     "the least recently used beyond --max-size (bytes, or B, K, M, G, T: powers of 1024), and\n"
     "with --stale those no build of this qforge and NVRTC can hit (or damaged). --dry-run only\n"
     "counts."},
    {"version", cmd_version,
     "",
     "qforge's version, its NVRTC, and what keys its kernel cache",
     "Prints qforge's version, the NVRTC it compiles with, and the kernel cache's format and\n"
     "device-header hash (both part of every cache key): what a bug report needs.\n"
     "qforge --version does the same."},
    {"help", cmd_help,
     "[<command>]",
     "this overview, or one command's usage",
     "Without a command: every command with its summary. With one: that command's usage, as\n"
     "qforge <command> --help (or -h) prints it."},
};

// "usage: qforge <name> " and the synopsis, its continuation lines aligned under the first.
void print_synopsis(std::ostream& os, const Command& c) {
  const std::string lead = std::string("usage: qforge ") + c.name;
  std::istringstream lines(c.synopsis);
  std::string line;
  bool first = true;
  while (std::getline(lines, line)) {
    os << (first ? lead : std::string(lead.size(), ' ')) << " " << line << "\n";
    first = false;
  }
  if (first) os << lead << "\n";
}

}  // namespace

const Command* find_command(const std::string& name) {
  if (name == "--version") return find_command("version");
  for (const Command& c : kCommands)
    if (name == c.name) return &c;
  return nullptr;
}

void print_overview(std::ostream& os) {
  os << "usage: qforge <command> [options]\n"
        "       qforge <command> --help   (or -h, or qforge help <command>): that command's usage\n"
        "\n"
        "commands:\n";
  for (const Command& c : kCommands) {
    const std::string name = c.name;
    os << "  " << name << std::string(name.size() < 10 ? 10 - name.size() : 1, ' ') << c.summary << "\n";
  }
  os << "\n" << kExitCodes << "\n";
}

void print_usage(std::ostream& os, const Command& c) {
  print_synopsis(os, c);
  os << "\n" << c.summary << "\n";
  if (*c.details) os << "\n" << c.details << "\n";
  os << "\n" << kExitCodes << "\n";
}

int cmd_help(const Argv& args) {
  if (args.empty()) {
    print_overview(std::cout);
    return 0;
  }
  if (args.size() > 1) throw UserError(args[1], "help takes at most one command");
  const Command* c = find_command(args[0]);
  if (!c) throw UserError("", "unknown command \"" + args[0] + "\" (see qforge help)");
  print_usage(std::cout, *c);
  return 0;
}

}  // namespace qf::cli
