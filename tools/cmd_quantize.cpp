// qforge quantize --recipe R --role ROLE --input x.npy --out DIR: runs one quantize on the CPU
// reference (reference/executor.h), or with --device cuda on GPU 0 through rt::Quantizer, and
// writes every output buffer as <name>.npy plus a manifest.json describing them.
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "compiler/buffers.h"
#include "compiler/pipeline.h"
#include "qforge/numerics.cuh"
#include "reference/executor.h"
#include "runtime/driver.h"
#include "runtime/quantizer.h"
#include "tools/args.h"
#include "tools/cli_common.h"
#include "tools/commands.h"
#include "tools/npy.h"

namespace qf::cli {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

uint64_t parse_u64(const Args& args, const std::string& flag) {
  auto v = args.get(flag);
  if (!v) return 0;
  // Decimal digits, or 0x / 0X and hex digits: no sign, no spaces, no octal.
  const bool hex = v->size() > 2 && (*v)[0] == '0' && ((*v)[1] == 'x' || (*v)[1] == 'X');
  const size_t first = hex ? 2 : 0;
  bool digits = v->size() > first;
  for (size_t i = first; i < v->size(); ++i)
    digits &= hex ? std::isxdigit(static_cast<unsigned char>((*v)[i])) != 0 : std::isdigit(static_cast<unsigned char>((*v)[i])) != 0;
  errno = 0;
  char* end = nullptr;
  const unsigned long long x = digits ? std::strtoull(v->c_str() + first, &end, hex ? 16 : 10) : 0;
  if (!digits || errno == ERANGE || end != v->c_str() + v->size())
    throw UserError(flag, "expected an unsigned 64-bit integer (decimal or 0x hex), got \"" + *v + "\"");
  return uint64_t(x);
}

float parse_scale_value(const std::string& text, const std::string& entry) {
  errno = 0;
  char* end = nullptr;
  const float f = std::strtof(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(f) || !(f > 0))
    throw UserError("--scale", "expected a positive finite number (or NAME=number), got \"" + entry + "\"");
  return f;
}

// --splits: the members' row counts (parse_row_counts' rules), which must add up to the input's M.
std::vector<int64_t> parse_splits(const std::string& s, int64_t m) {
  const std::vector<int64_t> out = parse_row_counts("--splits", s);
  int64_t sum = 0;
  for (int64_t v : out) sum += v;  // at most 2^31 each, far fewer than 2^32 items on a command line
  if (sum != m)
    throw UserError("--splits", "the member sizes sum to " + std::to_string(sum) + ", but the input has M = " +
                                    std::to_string(m) + " rows");
  return out;
}

std::string kind_name(BufferKind k) {
  switch (k) {
    case BufferKind::Data: return "data";
    case BufferKind::ScaleInv: return "scale_inv";
    case BufferKind::Amax: return "amax";
    case BufferKind::Scale: return "scale";
  }
  return "?";
}

std::string storage_descr(Storage s) {
  switch (s) {
    case Storage::U8: return "|u1";
    case Storage::U16: return "<u2";
    case Storage::F32: return "<f4";
  }
  return "|u1";
}


void write_text_atomic(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw UserError(path.string(), "cannot open for writing");
    f << text;
    f.close();
    if (!f) throw UserError(path.string(), "write failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw UserError(path.string(), "cannot rename the temporary file into place: " + ec.message());
}

// The descriptors ref::quantize_grouped gives its outputs (same names, bytes and shapes), so the
// device path writes the same files: each buffer stacks the members along dim 0 when their
// non-empty buffers agree on the trailing dims, and is flat otherwise.
std::vector<BufferDesc> grouped_descs(const Plan& plan, std::span<const int64_t> splits, int64_t k) {
  std::vector<BufferDesc> outs = output_buffers(plan, {0, k});
  std::vector<std::optional<std::vector<int64_t>>> trailing(outs.size());
  std::vector<bool> flat(outs.size(), false);
  std::vector<int64_t> stacked(outs.size(), 0), elems(outs.size(), 0);
  for (auto& o : outs) o.bytes = 0, o.shape.clear();
  for (int64_t m : splits) {
    const std::vector<BufferDesc> member = output_buffers(plan, {m, k});
    QF_CHECK(member.size() == outs.size(), "member buffers match the grouped buffers");
    for (size_t b = 0; b < outs.size(); ++b) {
      const auto& md = member[b];
      outs[b].bytes += md.bytes;
      int64_t n = 1;
      for (int64_t v : md.shape) n *= v;
      elems[b] += n;
      if (n == 0) continue;
      std::vector<int64_t> tail(md.shape.begin() + 1, md.shape.end());
      stacked[b] += md.shape[0];
      if (!trailing[b]) trailing[b] = tail;
      else if (*trailing[b] != tail) flat[b] = true;
    }
  }
  for (size_t b = 0; b < outs.size(); ++b) {
    if (flat[b] || !trailing[b]) {
      outs[b].shape = {elems[b]};
    } else {
      outs[b].shape = {stacked[b]};
      outs[b].shape.insert(outs[b].shape.end(), trailing[b]->begin(), trailing[b]->end());
    }
  }
  return outs;
}

// UserError("--device", ...) unless a CUDA driver and a device are usable.
void require_cuda_device() {
  const rt::Driver& d = rt::driver();
  if (!d.available()) throw UserError("--device", "no CUDA device: " + d.unavailable_reason());
  int n = 0;
  try {
    n = rt::device_count();
  } catch (const rt::CudaError& e) {
    throw UserError("--device", std::string("no CUDA device: ") + e.what());
  }
  if (n == 0) throw UserError("--device", "no CUDA device: the driver reports no devices");
}

// The device path: the same outputs as ref::quantize / ref::quantize_grouped, computed by
// rt::Quantizer on GPU 0.
std::vector<ref::Output> quantize_on_device(const Plan& plan, const ref::HostTensor& x, bool grouped,
                                            std::span<const int64_t> splits, const ref::QuantizeParams& params) {
  try {
    rt::primary_context(0)->make_current();
  } catch (const rt::CudaError& e) {
    throw UserError("--device", std::string("no CUDA device: ") + e.what());
  }
  const rt::Quantizer q(plan);
  const Shape2D shape = x.shape;
  const int members = grouped ? int(splits.size()) : 1;

  rt::DeviceBuffer input(x.bytes.size());
  input.upload(x.bytes.data(), x.bytes.size());
  rt::QuantizeCall call;
  call.input = rt::TensorView{input.address(), int64_t(input.size()), x.dtype, {shape.m, shape.k}};
  call.shape = shape;
  call.seed = params.seed;
  call.offset = params.offset;

  // Output descriptors exactly as the CPU path produces them; sizes cross-checked against the
  // runtime's own grouped sizes.
  std::vector<BufferDesc> descs = grouped ? grouped_descs(plan, splits, shape.k) : q.outputs(shape);
  if (grouped) {
    const std::vector<BufferDesc> rt_descs = q.grouped_outputs(splits, shape.k);
    QF_CHECK(rt_descs.size() == descs.size(), "grouped output count");
    for (size_t i = 0; i < descs.size(); ++i)
      QF_CHECK(rt_descs[i].name == descs[i].name && rt_descs[i].bytes == descs[i].bytes, "grouped output ",
               descs[i].name, " sizes agree");
  }
  // Allocated as the runtime checks grouped buffers: for the worst split into `members` parts.
  const std::vector<BufferDesc> capacity = grouped ? q.grouped_capacity(shape, members) : descs;
  QF_CHECK(capacity.size() == descs.size(), "output count");
  std::vector<rt::DeviceBuffer> bufs;
  bufs.reserve(descs.size() + 4);
  for (size_t i = 0; i < descs.size(); ++i) {
    const BufferDesc& b = descs[i];
    QF_CHECK(capacity[i].name == b.name && capacity[i].bytes >= b.bytes, "capacity of ", b.name);
    bufs.emplace_back(size_t(std::max<int64_t>(capacity[i].bytes, 16)));
    call.buffers[b.name] = rt::TensorView{bufs.back().address(), int64_t(bufs.back().size()), std::nullopt, {}};
  }
  for (const BufferDesc& b : q.inputs()) {
    const float scale = params.scales.at(b.name);
    bufs.emplace_back(sizeof(float));
    bufs.back().upload(&scale, sizeof(float));
    call.buffers[b.name] = rt::TensorView{bufs.back().address(), int64_t(sizeof(float)), std::nullopt, {}};
  }
  rt::DeviceBuffer workspace(size_t(q.workspace_bytes(shape, members)));
  call.workspace = rt::TensorView{workspace.address(), int64_t(workspace.size()), std::nullopt, {}};
  rt::DeviceBuffer offsets;
  if (grouped) {
    std::vector<int64_t> rows(splits.size() + 1, 0);
    for (size_t i = 0; i < splits.size(); ++i) rows[i + 1] = rows[i] + splits[i];
    offsets = rt::DeviceBuffer(rows.size() * sizeof(int64_t));
    offsets.upload(rows.data(), rows.size() * sizeof(int64_t));
    call.member_rows = offsets.address();
    call.num_members = members;
  }

  rt::Stream stream;
  q.quantize(call, stream.get());
  stream.synchronize();

  std::vector<ref::Output> outs;
  for (size_t i = 0; i < descs.size(); ++i) {
    ref::Output o;
    o.desc = descs[i];
    o.bytes.resize(size_t(descs[i].bytes));
    if (!o.bytes.empty()) bufs[i].download(o.bytes.data(), o.bytes.size());
    outs.push_back(std::move(o));
  }
  return outs;
}

}  // namespace

int cmd_quantize(const Argv& argv) {
  Args args(argv,
            {"--recipe", "--role", "--input", "--out", "--usage", "--dtype", "--seed", "--offset", "--scale",
             "--splits", "--device"},
            {});
  if (!args.positional().empty())
    throw UserError(args.positional()[0], "unexpected argument; quantize takes only --options (see qforge quantize --help)");
  const std::string recipe_path = args.require("--recipe");
  const std::string role = args.require("--role");
  const std::string input_path = args.require("--input");
  const std::filesystem::path out_dir = args.require("--out");
  const std::optional<Usage> usage = parse_usage_arg(args);
  const uint64_t seed = parse_u64(args, "--seed");
  const uint64_t offset = parse_u64(args, "--offset");
  const std::string device = args.get("--device").value_or("cpu");
  if (device != "cpu" && device != "cuda")
    throw UserError("--device", "expected cpu or cuda, got \"" + device + "\"");
  if (device == "cuda") require_cuda_device();

  const Recipe recipe = load_recipe(recipe_path);
  // Resolve the role early so that a role the recipe does not cover is reported before the input.
  (void)resolve_role(recipe, role);

  // ---- the input tensor ----
  // The shape is checked before the data is read: [M, K] within the limits of a call (a grouped
  // input, --splits, may have M = 0).
  const bool grouped = args.get("--splits").has_value();
  npy::Array arr = npy::read(input_path, [&](const std::vector<int64_t>& s) {
    if (s.size() != 2)
      throw UserError(input_path, "expected a 2-D array [M, K], got shape " + shape_str(s) +
                                      " (reshape 1-D data to [1, n] explicitly)");
    check_extent(Shape2D{s[0], s[1]}, grouped, input_path);
  });
  DType file_dtype;
  if (arr.descr == "<f4") file_dtype = DType::FP32;
  else if (arr.descr == "<f2") file_dtype = DType::FP16;
  else if (arr.descr == "<u2") file_dtype = DType::BF16;
  else
    throw UserError(input_path, "input dtype descr '" + arr.descr +
                                    "' is not supported: expected '<f4' (fp32), '<f2' (fp16) or '<u2' (bf16 bit patterns)");
  const Shape2D shape{arr.shape[0], arr.shape[1]};

  DType dtype = file_dtype;
  if (args.get("--dtype")) {
    const DType want = parse_dtype_arg(args, "--dtype");
    if (want != file_dtype) {
      if (file_dtype != DType::FP32)
        throw UserError("--dtype", std::string(traits(want).name) + " does not match the input file (descr '" +
                                       arr.descr + "' is " + std::string(traits(file_dtype).name) +
                                       "); only fp32 ('<f4') input can be rounded to bf16 or fp16");
      // Round fp32 to the requested dtype (RNE; NaN -> canonical quiet NaN with its sign).
      const int64_t n = arr.elements();
      std::vector<uint8_t> narrow(size_t(n) * 2);
      for (int64_t i = 0; i < n; ++i) {
        float f;
        std::memcpy(&f, arr.data.data() + 4 * i, 4);
        const uint16_t h = want == DType::BF16 ? f32_to_bf16(f) : f32_to_f16(f);
        narrow[size_t(2 * i)] = uint8_t(h & 0xFF);
        narrow[size_t(2 * i + 1)] = uint8_t(h >> 8);
      }
      arr.data = std::move(narrow);
      dtype = want;
    }
  }

  std::vector<int64_t> splits;
  if (grouped) splits = parse_splits(*args.get("--splits"), shape.m);

  // ---- the plan ----
  const Plan plan = compile_plan(recipe, PlanRequest{role, dtype, usage, grouped});
  if (!grouped) check_shape(plan, shape);
  else check_grouped_shape(plan, shape);

  // ---- delayed-scaling scale inputs ----
  ref::QuantizeParams params;
  params.seed = seed;
  params.offset = offset;
  const std::vector<BufferDesc> inputs = input_buffers(plan);
  std::string input_names;
  for (const auto& b : inputs) input_names += (input_names.empty() ? "" : ", ") + b.name;
  std::optional<float> all_scales;
  std::map<std::string, float> named;
  for (const std::string& entry : args.all("--scale")) {
    if (auto eq = entry.find('='); eq != std::string::npos) {
      const std::string nm = entry.substr(0, eq);
      bool known = false;
      for (const auto& b : inputs) known |= b.name == nm;
      if (!known)
        throw UserError("--scale", "this plan has no scale input \"" + nm + "\"" +
                                       (inputs.empty() ? std::string(" (it takes no scale inputs)")
                                                       : " (its scale inputs: " + input_names + ")"));
      named[nm] = parse_scale_value(entry.substr(eq + 1), entry);
    } else {
      all_scales = parse_scale_value(entry, entry);
    }
  }
  if (inputs.empty() && all_scales)
    throw UserError("--scale", "this plan takes no scale inputs (only delayed scaling does)");
  for (const auto& b : inputs) {
    if (auto it = named.find(b.name); it != named.end()) params.scales[b.name] = it->second;
    else if (all_scales) params.scales[b.name] = *all_scales;
    else
      throw UserError("--scale", "delayed scaling needs the scale input \"" + b.name +
                                     "\": pass --scale F (every scale input) or --scale " + b.name + "=F");
  }

  // ---- run ----
  ref::HostTensor x;
  x.dtype = dtype;
  x.shape = shape;
  x.bytes = std::move(arr.data);
  std::vector<ref::Output> outs;
  if (device == "cuda") outs = quantize_on_device(plan, x, grouped, splits, params);
  else outs = grouped ? ref::quantize_grouped(plan, x, splits, params) : ref::quantize(plan, x, params);

  // ---- write ----
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec || !std::filesystem::is_directory(out_dir))
    throw UserError("--out", "cannot create the output directory \"" + out_dir.string() + "\"" +
                                 (ec ? ": " + ec.message() : std::string()));

  nlohmann::ordered_json manifest;
  manifest["recipe"] = recipe.name;
  manifest["recipe_file"] = recipe_path;
  manifest["role"] = role;
  manifest["usage"] = std::string(name(plan.usage));
  manifest["device"] = device;
  manifest["dtype"] = std::string(traits(dtype).name);
  manifest["input"] = input_path;
  manifest["input_descr"] = arr.descr;
  manifest["shape"] = {shape.m, shape.k};
  manifest["seed"] = seed;
  manifest["offset"] = offset;
  if (grouped) manifest["splits"] = splits;
  else manifest["splits"] = nullptr;
  manifest["scales"] = nlohmann::ordered_json::object();
  for (const auto& [k, v] : params.scales) manifest["scales"][k] = v;
  manifest["buffers"] = nlohmann::ordered_json::array();

  for (const ref::Output& o : outs) {
    const BufferDesc& d = o.desc;
    const int isz = int(storage_bytes(d.storage));
    std::vector<int64_t> fshape = d.shape;
    int64_t n = 1;
    for (int64_t v : fshape) n *= v;
    if (n * isz != int64_t(o.bytes.size())) fshape = {int64_t(o.bytes.size()) / isz};
    const std::string file = d.name + ".npy";
    npy::write(out_dir / file, storage_descr(d.storage), fshape, o.bytes);
    nlohmann::ordered_json b;
    b["name"] = d.name;
    b["kind"] = kind_name(d.kind);
    b["direction"] = d.stream >= 0 && size_t(d.stream) < plan.streams.size()
                         ? nlohmann::ordered_json(std::string(name(plan.streams[size_t(d.stream)].dir)))
                         : nlohmann::ordered_json(nullptr);
    b["dtype"] = d.dtype;
    b["npy_descr"] = storage_descr(d.storage);
    b["shape"] = fshape;
    b["bytes"] = o.bytes.size();
    b["zero_padding"] = d.zero_padding;
    b["scale_layout"] = d.scale_layout.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(d.scale_layout);
    b["file"] = file;
    manifest["buffers"].push_back(b);

    std::cout << d.name << ": " << d.dtype << shape_str(fshape) << " " << o.bytes.size() << " B -> "
              << (out_dir / file).string();
    if (d.storage == Storage::F32 && o.bytes.size() == 4) {
      float v;
      std::memcpy(&v, o.bytes.data(), 4);
      std::ostringstream vs;
      vs.precision(9);
      vs << v;
      std::cout << " (" << vs.str() << ")";
    }
    std::cout << "\n";
  }
  write_text_atomic(out_dir / "manifest.json", manifest.dump(2) + "\n");
  return 0;
}

}  // namespace qf::cli
