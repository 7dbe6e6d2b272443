// The device headers of templates/qforge, embedded at build time (templates/embed.cmake).
#pragma once
#include <span>
#include <string_view>

namespace qf::templates {

struct EmbeddedFile {
  std::string_view name;  // include name, e.g. "qforge/numerics.cuh"
  std::string_view text;
};

// Every embedded header, sorted by name.
std::span<const EmbeddedFile> all();

}  // namespace qf::templates
